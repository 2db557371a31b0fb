"""A call on credit's record, as a retry under its call id reads it: the answer again only for
the identical request that paid for it, a 409 while it is in flight, else refused."""

from __future__ import annotations

import msgspec

from gateway.methods.credit.calls import AnswerAgain, NotAgain, StillInFlight, credit_call
from gateway.methods.exact.ledger import ANSWER_CAP_BYTES, ANSWER_TTL_MS, StoredResponse

CALL = credit_call("route", "W", "nonce", b'{"id":1}', 31_000)
ANSWER = StoredResponse(200, b'{"result":1}', "application/json")


def test_the_identical_request_gets_its_kept_answer_for_ten_minutes() -> None:
    answered = CALL.answered(ANSWER)

    assert (answered.key, answered.ttl_ms) == (CALL.key, ANSWER_TTL_MS)
    assert CALL.earlier(answered.value) == AnswerAgain(ANSWER)


def test_an_answer_is_kept_only_while_its_credential_could_be_presented_again() -> None:
    assert credit_call("r", "W", "n", b"", 31_000, 330_000).answered(ANSWER).ttl_ms == 330_000
    assert credit_call("r", "W", "n", b"", 31_000, 3_600_000).answered(ANSWER).ttl_ms == ANSWER_TTL_MS
    assert credit_call("r", "W", "n", b"", 31_000, 0).answered(ANSWER).ttl_ms == 1  # never forever


def test_another_request_under_the_same_call_id_is_refused_whatever_the_record() -> None:
    other = credit_call("route", "W", "nonce", b'{"id":2}', 31_000)

    for entry in (CALL.answered(ANSWER), CALL.in_flight(), CALL.failed()):
        assert isinstance(other.earlier(entry.value), NotAgain)


def test_in_flight_failed_too_large_absent_and_garbage_records() -> None:
    large = StoredResponse(200, b"x" * (ANSWER_CAP_BYTES + 1), "application/json")
    at_cap = StoredResponse(200, b"x" * ANSWER_CAP_BYTES, "application/json")

    assert isinstance(CALL.earlier(CALL.in_flight().value), StillInFlight)
    assert CALL.in_flight().ttl_ms == CALL.failed().ttl_ms == 31_000
    assert CALL.earlier(CALL.failed().value) == NotAgain(
        "this sign-in's call failed and took nothing: sign in again"
    )
    assert CALL.earlier(CALL.answered(at_cap).value) == AnswerAgain(at_cap)
    too_large = CALL.earlier(CALL.answered(large).value)
    assert isinstance(too_large, NotAgain) and "too large" in too_large.message
    assert CALL.earlier(None) == NotAgain("this sign-in was used already")
    assert CALL.earlier("not json") == NotAgain("this sign-in was used already")
    assert CALL.earlier(msgspec.json.encode({"fingerprint": CALL.fingerprint}).decode()) == NotAgain(
        "this sign-in was used already"
    )
