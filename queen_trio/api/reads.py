"""Queen's reads by offset: ``POST /api/v1/fetch`` and ``POST /api/v1/partitions/changed``
(queen_trio/log/reads.py). Read-only: no lease, no cursor. Requests and answers are models of
:mod:`queen_trio.models.log` (``FetchBody``/``Fetched``, ``ChangedBody``/``PartitionsChanged``)."""

from __future__ import annotations

import trio
from quart import Blueprint, Response

from ..log import reads
from ..models import log as models
from .common import broker as _broker
from .common import model_response
from .errors import read_object_via
from .tenancy import current_tenant_id

read_routes = Blueprint("reads", __name__, url_prefix="/api/v1")

# A parked fetch looks at its partitions' bounds this often (one indexed row each) and reads
# again only when they moved.
_RECHECK_S = 0.2


@read_routes.post("/fetch")
async def fetch() -> Response:
    """Records of each (queue, partition) from an absolute offset, with the partition's
    ``highWatermark`` and ``logStartOffset``; per-entry ``OFFSET_OUT_OF_RANGE`` (below the
    log start, or above the high watermark) and ``UNKNOWN_TOPIC_OR_PARTITION`` (no such queue).
    With ``maxWaitMs`` an answer with fewer than ``minBytes`` payload bytes waits for more."""
    req = reads.fetch_request(await read_object_via(models.FETCH_DECODER))
    if not req.entries:
        return model_response(models.Fetched(entries=[]))
    broker = _broker()
    tenant = current_tenant_id()
    answer = await broker.db.run_transaction(reads.fetch, tenant, req, broker.segment_cache)
    deadline = trio.current_time() + req.max_wait_ms / 1000
    while not answer.any_error and answer.bytes < req.min_bytes:
        left = deadline - trio.current_time()
        if left <= 0:
            break
        await trio.sleep(min(_RECHECK_S, left))
        if await broker.db.run_transaction(reads.moved, tenant, req, answer.bounds):
            answer = await broker.db.run_transaction(reads.fetch, tenant, req, broker.segment_cache)
    return model_response(answer.body)


@read_routes.post("/partitions/changed")
async def partitions_changed() -> Response:
    """Each queue's partitions (by name, or those written at or after ``since`` by last write)
    a page at a time (``next``), with ``lastOffset``, ``logStart``, ``lastWriteAt``, and the
    ``safeTime`` to pass as the next ``since``."""
    entries = reads.changed_request(await read_object_via(models.CHANGED_DECODER))
    return model_response(await _broker().db.run_transaction(
        reads.partitions_changed, current_tenant_id(), entries))
