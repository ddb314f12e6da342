"""One module per CLI command: `main(**options) -> exit code`."""
