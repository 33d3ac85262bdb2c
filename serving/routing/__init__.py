"""Which version answers a request: labels, the traffic split, shadow choice, fallback and the circuit breakers.

`Router.route` answers once per predict with a `Route(primary, retry, shadow, why, fallback)`; the versions it
chooses from are pushed to it by the repository (serving/repository/manager.py) whenever they change.
"""
