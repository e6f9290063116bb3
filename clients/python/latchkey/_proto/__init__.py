"""The gRPC stubs of latchkey.v1, generated at build time (see setup.py)."""
