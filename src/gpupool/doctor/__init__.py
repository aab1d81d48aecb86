"""`gpupool doctor`: checks an installation of the chart end to end and says what is wrong and how to fix it.

`checks` holds the verdicts, plain functions over the objects the API server returns (tested on hand-built
objects); `rbac` the rights each component needs; `collect` reads the cluster through the port, runs the
probes (a server-side dry-run pod, SubjectAccessReviews, the extender's /readyz) and hands what it got to
the checks. The command (`gpupool.commands.doctor`) only prints.
"""
