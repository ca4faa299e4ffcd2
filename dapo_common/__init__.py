"""The leaf below every layer: what dapo_core, db, flows and the dashboard all speak.

It holds the metric names (`metric_names`), small formatting and system helpers (`util`), the
command line's value types and user errors (`cli_args`), terminal text (`text`) and the fields
of a stored rollout, the sample record (`samples`). Standard
library only, and it imports nothing from the project: db may import it without importing
dapo_core (no torch in `dapo table`), and dapo_core without importing db. It is a package of its
own, not part of dapo_lab, because dapo_lab sits above the layers (docs/architecture.md).
"""
