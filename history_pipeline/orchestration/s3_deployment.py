"""The code location of a deployment on S3: every setting through the environment (``dg.EnvVar``).

Load it instead of ``definitions`` (``workspace.yaml``: ``python_module:
history_pipeline.orchestration.s3_deployment``) with ``HISTORY_PIPELINE_ROOT=s3://bucket/prefix``,
``HISTORY_PIPELINE_WAL_ROOT`` (the local folder of the WALs), ``AWS_ENDPOINT_URL``, ``AWS_REGION``,
``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY`` set where the code location and the daemon run.
"""

from history_pipeline.orchestration.definitions import build_definitions, s3_history_root

defs = build_definitions(s3_history_root())
