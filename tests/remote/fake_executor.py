"""STAND-IN for `globus_compute_sdk.Executor` (the Globus Compute cloud is unreachable here).

What it fakes: the cloud service and the endpoint. What it keeps real: the SDK's own
serializer (`globus_compute_sdk.serialize.ComputeSerializer`) and a separate process.

* `submit(fn, *args, **kwargs)` serializes the function with the executor's `serializer`
  code strategy (as `Client.register_function` does) and the arguments with its data
  strategy (as `Batch.add` does), packs the three buffers (`pack_buffers`), and hands the
  package to a NEW Python process, which unpacks and deserializes it
  (`unpack_and_deserialize`, as the endpoint's worker does), runs the function there,
  and serializes the result with `result_serializers` (`serialize_from_list`, as the
  endpoint does). The result comes back as that string and is deserialized here.
  So a function the endpoint could not import, an argument or result the strategies
  cannot carry (non-JSON with the JSONData strategy), or anything that relies on this
  process's memory fails here as it would through the real service.
* Results larger than the service's 10 MiB limit are refused, as the service does.
* `fake_versions={"parsl": "2025.1.6"}` pretends the endpoint's environment has other
  distributions installed: the worker process patches `importlib.metadata.version` for
  those names (None: not installed) before it runs the function.
* Not faked: auth, task groups, batching, retries, AMQP. `serializer` is a settable
  attribute as on the real Executor (it is the client's `fx_serializer` there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from globus_compute_sdk.serialize import ComputeSerializer

RESULT_LIMIT_BYTES = 10 * 2**20

_WORKER = r"""
import importlib.metadata as md, json, sys, traceback
from globus_compute_sdk.serialize import ComputeSerializer

payload_path, result_path, fake, strategies = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
if fake:
    _real = md.version
    def _version(name):
        if name in fake:
            if fake[name] is None:
                raise md.PackageNotFoundError(name)
            return fake[name]
        return _real(name)
    md.version = _version
try:
    fn, args, kwargs = ComputeSerializer().unpack_and_deserialize(open(payload_path).read())
    out = "ok\n" + ComputeSerializer.serialize_from_list(fn(*args, **kwargs), strategies or None)
except BaseException:
    out = "err\n" + traceback.format_exc()
with open(result_path, "w") as f:
    f.write(out)
"""


class RemoteTaskFailed(Exception):
    """The function raised on the (fake) endpoint; the message is its traceback there
    (the real SDK raises TaskExecutionFailed with the remote traceback)."""


class FakeExecutor:
    """A `globus_compute_sdk.Executor` look-alike that runs each task in a fresh local process."""

    def __init__(self, endpoint_id: Any = None, *, serializer: ComputeSerializer | None = None,
                 result_serializers: list[str] | None = None, fake_versions: dict[str, str | None] | None = None,
                 env: dict[str, str] | None = None, **_ignored: Any) -> None:
        self.endpoint_id = endpoint_id
        self.serializer = serializer or ComputeSerializer()
        self.result_serializers = list(result_serializers or [])
        self.fake_versions = dict(fake_versions or {})
        self.env = {**os.environ, **(env or {})}
        self.calls: list[str] = []
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fake-endpoint")
        self._tmp = tempfile.TemporaryDirectory(prefix="fake-endpoint-")

    def submit(self, fn: Any, *args: Any, **kwargs: Any) -> Future[Any]:
        if self.endpoint_id is None:
            raise ValueError("No endpoint_id set.  Did you forget to set it at construction?")
        s = self.serializer
        packed = s.pack_buffers([s.serialize(fn), s.serialize(args), s.serialize(kwargs)])
        self.calls.append(getattr(fn, "__name__", repr(fn)))
        return self._pool.submit(self._run, packed, len(self.calls))

    def _run(self, packed: str, n: int) -> Any:
        task = Path(self._tmp.name) / f"task-{n}"
        (task.with_suffix(".in")).write_text(packed)
        with (task.with_suffix(".log")).open("w") as log:
            subprocess.run([sys.executable, "-c", _WORKER, str(task.with_suffix(".in")), str(task.with_suffix(".out")),
                            json.dumps(self.fake_versions), json.dumps(self.result_serializers)],
                           stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env, check=False)
        status, _, body = (task.with_suffix(".out")).read_text().partition("\n")
        if status != "ok":
            raise RemoteTaskFailed(body)
        if len(body.encode()) > RESULT_LIMIT_BYTES:
            raise RemoteTaskFailed(f"result of {len(body.encode())} bytes exceeds the {RESULT_LIMIT_BYTES}-byte limit")
        return ComputeSerializer().deserialize(body)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)
        self._tmp.cleanup()
