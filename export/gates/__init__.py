"""export/gates."""
