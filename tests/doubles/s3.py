"""An S3 endpoint on 127.0.0.1 for tests: moto's threaded server, as a bucket on a real
cluster would be, reached through the standard AWS variables (`AWS_ENDPOINT_URL`, keys,
region), which pyarrow and every Ray process read from their environment."""
from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

BUCKET = "rexeval-test"


@contextlib.contextmanager
def s3_server() -> Iterator[dict[str, str]]:
    """A started moto S3 server holding an empty bucket `BUCKET`; yields the environment
    variables that point a process at it."""
    import boto3
    from moto.server import ThreadedMotoServer

    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_EC2_METADATA_DISABLED": "true"}
        boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id="testing",
                     aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket=BUCKET)
        yield env
    finally:
        server.stop()


def fresh_prefix() -> str:
    """A new, empty folder in the test bucket."""
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"
