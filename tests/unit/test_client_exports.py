"""The SDK's public surface is what was meant: nothing missing, nothing accidental."""

from __future__ import annotations

import zipfile
from pathlib import Path

import queen_trio
import queen_trio.client as sdk


def test_the_exported_names() -> None:
    assert set(sdk.__all__) == {
        "DEFAULT_URL", "NO_RETRIES", "AckResult", "AckStatus", "ApiError", "BadRequest",
        "Batch", "BrokerUnreachable", "Client", "Conflict", "ConsumeStats", "DeadLetter",
        "Forbidden", "KvEntry", "KvPage", "KvPrecondition", "KvRows", "KvWrite", "Lock",
        "LockHolder", "LockNotAcquired", "LockNotHeld", "LockResult", "Message",
        "NotFound", "Page", "PayloadTooLarge",
        "PushResult", "PushStatus", "QueenClientError", "QueueConfig", "RateLimited",
        "Replayed", "RetryPolicy", "ServerError", "StorageFull", "SyncClient", "SyncLock",
        "TimerInfo",
        "TimerMark", "TimerResult", "TimerState", "TimerStatus", "TransactionRefused",
        "TransactionResult",
        "Unauthorized", "delay_ms", "format_ms", "ttl_seconds",
    }
    for name in sdk.__all__:
        assert getattr(sdk, name) is not None


def test_the_package_offers_both_clients() -> None:
    assert queen_trio.Client is sdk.Client and queen_trio.SyncClient is sdk.SyncClient
    assert {"Client", "SyncClient"} <= set(queen_trio.__all__)


def test_every_api_error_is_a_client_error() -> None:
    for name in ("BadRequest", "Unauthorized", "Forbidden", "NotFound", "Conflict",
                 "PayloadTooLarge", "RateLimited", "StorageFull", "ServerError",
                 "TransactionRefused"):
        assert issubclass(getattr(sdk, name), sdk.ApiError)
    assert issubclass(sdk.ApiError, sdk.QueenClientError)
    assert issubclass(sdk.BrokerUnreachable, sdk.QueenClientError)


def test_statuses_compare_equal_to_their_wire_strings() -> None:
    too_late: str = sdk.TimerStatus.TOO_LATE  # a str, as a caller comparing to the wire has it
    assert too_late == "too_late" and sdk.TimerStatus("absent").name == "ABSENT"
    assert [s.value for s in sdk.TimerStatus] == ["scheduled", "rescheduled", "cancelled",
                                                  "absent", "too_late"]


def test_every_sdk_name_is_importable_from_the_package() -> None:
    """``from queen_trio import ApiError, TimerStatus`` works, as the docs show it."""
    from queen_trio import ApiError, TimerStatus

    assert ApiError is sdk.ApiError and TimerStatus is sdk.TimerStatus
    assert set(queen_trio.__all__) == {*sdk.__all__, "__version__"}
    for name in sdk.__all__:
        assert getattr(queen_trio, name) is getattr(sdk, name)


def test_the_package_is_typed_and_the_wheel_ships_the_marker(tmp_path: Path) -> None:
    """PEP 561: ``py.typed`` sits in the package and hatchling puts it in the wheel."""
    root = Path(queen_trio.__file__).parent
    assert (root / "py.typed").is_file()
    from hatchling.builders.wheel import WheelBuilder

    wheel = next(iter(WheelBuilder(str(root.parent)).build(directory=str(tmp_path),
                                                           versions=["standard"])))
    with zipfile.ZipFile(wheel) as zf:
        assert "queen_trio/py.typed" in zf.namelist()
