"""The cost-model benchmark: the workloads run under each design (workloads.py), the native
times (native.py), the model fitted to them (costmodel.py, model.py), the published figures
(published.py) and the report (report.py)."""
