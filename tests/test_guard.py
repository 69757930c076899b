"""The guard every entry point runs under: decorator and block alike."""

import logging

import pytest

from ng_otel.otel._guard import guard, guarded
from ng_otel.testing import fresh_state, internal_errors_logged


def test_a_guarded_block_is_skipped_from_the_error_on_with_one_warning_naming_it(caplog):
    reached = []
    with fresh_state(), caplog.at_level(logging.WARNING, logger="ng_otel"), internal_errors_logged():
        for _ in range(3):
            with guard("the reply headers"):
                raise KeyError("x" * 1000)
            reached.append("after the block")
    assert reached == ["after the block"] * 3  # the host goes on
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith("ng_otel: internal error in the reply headers (KeyError: ")
    assert len(warning) < 300  # the message is bounded: it may quote data


def test_a_guarded_function_returns_none_and_base_exceptions_always_pass():
    @guarded
    def broken():
        raise ValueError("bug")

    @guarded
    def interrupted():
        raise KeyboardInterrupt

    with internal_errors_logged():
        assert broken() is None
        with pytest.raises(KeyboardInterrupt):
            interrupted()


def test_under_the_test_suite_both_forms_raise():
    with pytest.raises(ValueError):
        with guard("a block"):
            raise ValueError("bug")
    with pytest.raises(ValueError):
        guarded(lambda: int("x"))()
