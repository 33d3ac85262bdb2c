"""export/tf."""
