"""Whether a tracker's own library would refuse the backend a run gives it, asked before
anything is written (`dapo train`, a sweep's parameters). Torch-free: the dashboard's rerun form
validates a sweep's parameters, and with them this check. The trackers themselves are
dapo_core/train/trackers.py.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dapo_core.setup.config import ConfigError


def check_trackers(config: Mapping[str, Any]) -> None:
    """ConfigError (one line) when a tracker `config`'s run.loggers names would refuse the
    backend it is given, before anything is written: for MLflow, run.mlflow_uri (else
    $MLFLOW_TRACKING_URI) asked of MLflow's own store registry and, for its file store, of the
    file store itself (MLflow 3.17 refuses it unless MLFLOW_ALLOW_FILE_STORE=true). A library
    that is not installed is not refused here: the run warns once and goes on (open_trackers)."""
    run = config.get("run", {})
    if "mlflow" in (run.get("loggers") or ()):
        given = str(run.get("mlflow_uri") or "")
        uri = given or os.environ.get("MLFLOW_TRACKING_URI", "")
        where = f"run.mlflow_uri={uri}" if given else f"MLFLOW_TRACKING_URI={uri}"
        problem = mlflow_refusal(uri) if uri else None
        if problem:
            raise ConfigError(f"{where}: {problem}")


MLFLOW_DATABASE_SCHEMES = frozenset(
    {"sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks"}
)
"""Tracking URI schemes MLflow 3 has a store for (`postgresql+psycopg` counts as postgresql)."""


def mlflow_refusal(uri: str) -> str | None:
    """Why the installed MLflow would refuse tracking URI `uri`, in words a user can act on;
    None when it takes it (or MLflow is not installed: nothing to ask)."""
    from urllib.parse import urlparse

    scheme = urlparse(uri).scheme
    if len(scheme) == 1:  # a Windows drive letter: a path
        scheme = ""
    if scheme.split("+")[0] in MLFLOW_DATABASE_SCHEMES:
        return None  # taken by every MLflow 3; no need to import it (seconds) to ask
    try:
        import mlflow
        from mlflow.exceptions import MlflowException
    except ImportError:
        return None
    if scheme in ("", "file"):
        try:
            from mlflow.store.tracking.file_store import FileStore
        except ImportError:
            return None
        import tempfile

        # The file store's own check (it reads MLFLOW_ALLOW_FILE_STORE), on a scratch folder.
        with tempfile.TemporaryDirectory(prefix="dapo-mlflow-check-") as scratch:
            try:
                FileStore(scratch)
            except MlflowException:
                return (
                    f"MLflow {mlflow.__version__} refuses its file store (a path or file: URI) "
                    "unless MLFLOW_ALLOW_FILE_STORE=true: give a database, e.g. "
                    "sqlite:///PATH/mlflow.db, or a server's http:// URL (or no URI: a SQLite "
                    "store in each run directory)"
                )
        return None
    try:
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry
    except ImportError:  # a later MLflow moved it: the tracker's start says it instead
        return None
    try:
        _tracking_store_registry.get_store_builder(uri)
    except MlflowException:
        return (
            f"MLflow {mlflow.__version__} has no tracking store for {scheme}:// URIs "
            "(sqlite:///PATH/mlflow.db, postgresql://..., http(s):// of a server work)"
        )
    return None
