"""Buckets on the tests' S3 server (moto), created with boto3 (s3fs's mkdir fails on moto's region check)."""
from __future__ import annotations

import itertools
import os

_BUCKETS = itertools.count()


def make_bucket(endpoint: str) -> str:
    import boto3

    name = f"comgra-test-{os.getpid()}-{next(_BUCKETS)}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="test",
                 aws_secret_access_key="test").create_bucket(Bucket=name)
    return name
