"""What the server tells operators: Prometheus metrics (one process or shared), input drift, the request log."""
