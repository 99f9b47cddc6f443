"""Name -> function registries, one per kind (advantage estimator, policy loss, reward, confidence estimator).

Deliberately small: register with a decorator, look up by name, an error on duplicates and on unknown names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Generic, TypeVar

from capo.core.checks import did_you_mean

F = TypeVar("F", bound=Callable)


class UnknownNameError(ValueError):
    """Raised for a name no registry entry has; the message lists the allowed names."""


class Registry(Generic[F]):
    def __init__(self, kind: str):
        self.kind = kind
        self._fns: dict[str, F] = {}
        self._reads: dict[str, frozenset[str]] = {}
        self._batch_dependent: set[str] = set()
        self._per_response: dict[str, frozenset[str]] = {}

    def register(self, name: str, *, reads: tuple[str, ...] = (), batch_dependent: bool = False,
                 per_response: tuple[str, ...] = ()) -> Callable[[F], F]:
        """Decorator. ``reads``: the per-response inputs the function uses beyond the uniform signature's required
        ones (e.g. ``("scores",)``; CAPO's ``correct``, ``partners``, ``lengths``; ACE's ``confidence_shift``), so the
        engines know what to compute and what to pass: the one place this is said (callers read :meth:`reads`, never
        the signature). Each must be a keyword parameter of the function. ``batch_dependent``: a row's result
        depends on the other rows of the call beyond its group (Clip-Cov's and KL-Cov's token covariances and
        selection), so how a batch is split into calls (micro-batches, processes) changes the result
        (:meth:`batch_dependent`). ``per_response``: the logged metrics of a policy loss that are means over the
        responses with a real token (GSPO's sequence clip fraction); the others are means over real tokens, so a
        trainer combining micro-batches weights each by the right count (:meth:`per_response`)."""
        def deco(fn: F) -> F:
            if name in self._fns:
                raise ValueError(f"duplicate {self.kind} name {name!r}: already registered to {self._fns[name]!r}")
            unknown = sorted(set(reads) - set(inspect.signature(fn).parameters))
            if unknown:
                raise ValueError(f"{self.kind} {name!r} declares reads={unknown} that are not parameters of {fn!r}")
            self._fns[name] = fn
            self._reads[name] = frozenset(reads)
            if batch_dependent:
                self._batch_dependent.add(name)
            self._per_response[name] = frozenset(per_response)
            return fn

        return deco

    def get(self, name: str) -> F:
        try:
            return self._fns[name]
        except KeyError:
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}{did_you_mean(name, self._fns)}; allowed values: "
                f"{', '.join(sorted(self._fns))}"
            ) from None

    def reads(self, name: str) -> frozenset[str]:
        """The optional inputs ``name`` uses (declared at registration)."""
        self.get(name)
        return self._reads[name]

    def batch_dependent(self, name: str) -> bool:
        """Whether ``name``'s result for a row depends on the other rows it is called with (declared at
        registration): splitting a batch into micro-batches or processes then changes the result."""
        self.get(name)
        return name in self._batch_dependent

    def per_response(self, name: str) -> frozenset[str]:
        """The metrics of ``name`` that are means over responses with a real token, not over real tokens (declared at
        registration)."""
        self.get(name)
        return self._per_response[name]

    def names(self) -> list[str]:
        return sorted(self._fns)

    def __contains__(self, name: str) -> bool:
        return name in self._fns

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


ADVANTAGES: Registry = Registry("advantage estimator")
POLICY_LOSSES: Registry = Registry("policy loss")
REWARDS: Registry = Registry("reward")
CONFIDENCES: Registry = Registry("confidence estimator")
