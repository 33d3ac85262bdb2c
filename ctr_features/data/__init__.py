"""The Criteo data: the streaming reader of Criteo-format files (criteo.py, compressed.py) and the train/validation
split of row ids (split.py)."""
