"""Helpers the tests share (simulators, servers, PostgreSQL, browsers), imported as ``support.<module>``:
``tests/`` is on pytest's ``pythonpath``."""
