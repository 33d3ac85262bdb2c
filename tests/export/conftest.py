"""Export test fixtures: the session exports (`published`) live in tests/conftest.py, shared with tests/bench/."""
