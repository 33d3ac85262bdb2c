"""Start-up: the command line (config.py), TLS, the CPU plan, one server process or N workers on one port."""
