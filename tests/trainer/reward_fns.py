"""User reward functions for the guard tests (imported as reward_fns:NAME)."""

import time


def length_reward(prompt, response, gold):
    return len(response) / 100.0


def raises_on_some(prompt, response, gold):
    if len(response) % 2:
        raise RuntimeError("boom")
    return 1.0


def returns_nan(prompt, response, gold):
    return float("nan")


def sleeps(prompt, response, gold):
    time.sleep(5)
    return 1.0
