"""The results dashboard: one self-contained HTML page (static artifact or served live by `orch serve`)."""
