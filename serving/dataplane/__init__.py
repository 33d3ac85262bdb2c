"""The protocol-free predict path: the served models by name, request checks, one predict, output checks."""
