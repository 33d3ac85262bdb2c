"""The REST port's HTTP/1.1 layer: the listening socket, its limits and timeouts, and one client connection."""
