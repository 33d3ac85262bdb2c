"""export/publish."""
