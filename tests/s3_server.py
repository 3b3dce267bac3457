"""A local S3 server for the tests of the memory store on object storage: moto's
``moto_server`` in a subprocess on a free port, with one bucket
(:func:`tests.local_servers.moto_s3`, shared with the benchmarks); each test gets its own
prefix in it.
"""

from __future__ import annotations

import pytest

from tests.local_servers import BUCKET, S3Server, moto_s3

__all__ = ["BUCKET", "S3Server", "moto_s3", "on_local_and_s3"]

on_local_and_s3 = pytest.mark.parametrize("store", ["local", "s3"], indirect=True)
"""Runs a test of the ``store`` fixture (tests/conftest.py) on a local directory and on the local S3 server."""
