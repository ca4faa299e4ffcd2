"""Reading torch.distributed.checkpoint (DCP) directories without running code from them.

torch's own DCP reader unpickles a checkpoint's `.metadata` with the unrestricted pickle module,
and its default load planner unpickles every non-tensor item the same way (a full, not a
weights-only, torch load): a crafted `dcp/` folder in a run directory would run code in the
trainer the moment a run resumes from it. Here the metadata is unpickled by an allow-list of the
classes DCP itself writes (its metadata dataclasses, torch sizes, dtypes and layouts, the path it
records), and byte items load with `torch.load(weights_only=True)` (optimizer param groups are
plain numbers, strings and lists). Anything else is refused with one line naming the checkpoint.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path, PurePath
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

# (module, name) pairs DCP's FileSystemWriter pickles into `.metadata` (torch 2.x): what a
# checkpoint this project wrote contains, and all it may contain.
_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a torch.layout from its name
    ("pathlib", "PosixPath"),
    ("pathlib", "Path"),
    ("collections", "OrderedDict"),
}


class UnsafeCheckpoint(ValueError):
    """A DCP checkpoint that names something outside the allow-list."""


class MissingShard(ValueError):
    """A DCP checkpoint whose metadata names a shard file that is not there."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_CLASSES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpoint(f"names {module}.{name}, which a DCP checkpoint never holds")


def read_metadata(path: Path, file: str = ".metadata") -> Metadata:
    """A DCP directory's metadata, unpickled through the allow-list."""
    try:
        with (Path(path) / file).open("rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except UnsafeCheckpoint as exc:
        raise UnsafeCheckpoint(f"refusing checkpoint {path}: its {file} {exc}") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpoint(f"refusing checkpoint {path}: {file} is not DCP metadata")
    _check_storage_paths(Path(path), metadata, file)
    return metadata


def _check_storage_paths(path: Path, metadata: Metadata, file: str) -> None:
    """Every shard file the metadata names must lie inside the checkpoint's own directory: DCP's
    reader opens `<dir>/<relative_path>` as stored, so `../` or an absolute path (or a shard
    that is a symlink out) would read another file, anywhere, into the model."""
    root = path.resolve()
    storage = getattr(metadata, "storage_data", None) or {}
    if not isinstance(storage, dict):
        raise UnsafeCheckpoint(f"refusing checkpoint {path}: its {file} holds no shard table")
    for info in storage.values():
        stored = getattr(info, "relative_path", None)
        relative = PurePath(str(stored))
        if (
            not isinstance(stored, str | PurePath)
            or relative.is_absolute()
            or ".." in relative.parts
            or not (path / relative).resolve().is_relative_to(root)
        ):
            raise UnsafeCheckpoint(
                f"refusing checkpoint {path}: its {file} names the shard file {str(stored)[:120]!r}, "
                "outside the checkpoint's directory"
            )
        if not (path / relative).is_file():
            # A checkpoint that lost a shard (a partial copy, a full disk) cannot be resumed;
            # DCP's own error would come from deep inside the load, after the run began.
            raise MissingShard(
                f"checkpoint {path} is missing its shard file {relative} (named in its {file}): "
                "it cannot be resumed; restore the file, or point `latest` at another checkpoint"
            )


class SafeReader(dcp.FileSystemReader):
    """FileSystemReader whose metadata goes through the allow-list."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        file = Path(str(self._get_metadata_path(kwargs.get("rank")))).name
        metadata = read_metadata(Path(str(self.path)), file)
        storage = getattr(metadata, "storage_meta", None) or StorageMeta()  # as the parent's
        storage.load_id = self.load_id
        metadata.storage_meta = storage
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner with byte items loaded weights_only."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise UnsafeCheckpoint(
                f"refusing checkpoint item {read_item.dest_index.fqn}: {str(exc).splitlines()[0]}"
            ) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def load(state: dict[str, Any], path: Path) -> None:
    """dcp.load(state) from `path`, filling state's tensors in place, code-free.

    The metadata is checked before DCP starts (a refusal is one clean line, not DCP's report of
    every rank); a refused byte item comes back out of DCP's CheckpointException as itself."""
    read_metadata(path)
    try:
        dcp.load(state, storage_reader=SafeReader(str(path)), planner=SafeLoadPlanner())
    except CheckpointException as exc:
        for error, _trace in exc.failures.values():
            if isinstance(error, UnsafeCheckpoint):
                raise UnsafeCheckpoint(f"{error} (in {path})") from None
        raise
