"""The wire APIs: TF Serving's REST and gRPC, the Open Inference Protocol v2's REST and gRPC, one router.

Each protocol decodes with codecs/ and predicts through dataplane/. No protocol imports another's handlers:
the router (router.py) sends each REST path to its handlers and puts every gRPC service on one server.
"""
