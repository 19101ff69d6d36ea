"""The job registry: which handler runs a ``(module, job)`` key."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, overload

from .conf import duration
from .exceptions import AlreadyRegistered, UnknownJob
from .retry import RetryPolicy

if TYPE_CHECKING:
    from .passes import Pass
    from .store.rows import Rider

Handler = Callable[["Pass"], Mapping[str, Any] | None]
#: Statements written with a claim, each a :class:`~django_jobruns.store.rows.Rider`.
Statements = list["Rider"]
ClaimHook = Callable[[str, int, str, datetime], tuple[Statements, Statements]]

_lock = threading.Lock()

_jobs: dict[tuple[str, str], Job] = {}


class Job:
    """A registered handler and what the driver needs to know about it.

    Calling a ``Job`` calls its handler, so a decorated function stays usable as
    a function.
    """

    # Copied from the handler by ``functools.update_wrapper``.
    __name__: str
    __qualname__: str
    #: What this job writes with each claim of its runs, in the claim's transaction, and what undoes
    #: it if the claim is abandoned: ``(run_id, fence, holder, now) -> (statements, undo)``. The
    #: Tasks backend's jobs begin their attempt records so (a task costs two commits).
    on_claim: ClaimHook | None = None

    def __init__(
        self,
        handler: Handler,
        *,
        module: str,
        name: str,
        retry: RetryPolicy | None,
        lease: timedelta | None = None,
        timeout: timedelta | None = None,
    ) -> None:
        self.handler = handler
        self.module = module
        self.name = name
        self.retry = retry
        #: This job's lease length (``None``: the drive's ``lease_ttl``). Kept
        #: alive while a body runs (D17): it bounds how long a killed worker's run
        #: waits, not how long a step may take.
        self.lease = lease
        #: The longest one pass may run (``None``: ``JOBRUNS["TIMEOUT"]``, D19).
        self._timeout = timeout
        functools.update_wrapper(self, handler)

    @property
    def timeout(self) -> timedelta:
        """How long one pass may run before its lease is no longer renewed (D19)."""
        if self._timeout is not None:
            return self._timeout
        from . import conf

        return conf.timeout()

    @property
    def key(self) -> tuple[str, str]:
        return (self.module, self.name)

    @property
    def policy(self) -> RetryPolicy:
        """The retry policy this job's passes run under: its own, else ``JOBRUNS["DEFAULT_RETRY"]``."""
        if self.retry is not None:
            return self.retry
        from . import conf

        policy: RetryPolicy = conf.default_retry()
        return policy

    @property
    def label(self) -> str:
        """The ``"app_label.name"`` string that refers to this job."""
        return f"{self.module}.{self.name}"

    def __call__(self, p: Pass) -> Mapping[str, Any] | None:
        return self.handler(p)

    def __repr__(self) -> str:
        return f"<Job {self.label}>"


def _app_label_for(module_name: str) -> str:
    from django.apps import apps

    config = apps.get_containing_app_config(module_name)
    if config is not None:
        return config.label
    # Outside every installed app (a script, a test module): the top-level
    # package stands in for the label, so the key is still stable.
    return module_name.split(".")[0]


@overload
def job(name: Handler, /) -> Job: ...


@overload
def job(
    name: str | None = None,
    *,
    retry: RetryPolicy | None = None,
    lease: timedelta | float | None = None,
    timeout: timedelta | float | None = None,
) -> Callable[[Handler], Job]: ...


def job(
    name: str | Handler | None = None,
    *,
    retry: RetryPolicy | None = None,
    lease: timedelta | float | None = None,
    timeout: timedelta | float | None = None,
) -> Job | Callable[[Handler], Job]:
    """Register a handler as a job, under ``(app label, name)``.

    ``name`` defaults to the function's name; the app label is that of the
    installed app whose module defines the function. ``lease`` (a timedelta or
    seconds) is this job's lease length: how long a killed worker's run waits
    before another drive takes it over (a live worker keeps it alive however
    long its steps run). ``timeout`` bounds one pass (default
    ``JOBRUNS["TIMEOUT"]``, an hour): past it the lease is no longer renewed and
    the run is taken over, charged. Usable bare (``@job``) or called (``@job()``,
    ``@job("name", retry=...)``). Registering a second handler under a key that
    is taken raises :class:`AlreadyRegistered` (re-executing the same
    definition, as a module reload does, replaces it).
    """
    if callable(name):
        return job()(name)
    length = None if lease is None else duration(lease, "lease")
    limit = None if timeout is None else duration(timeout, "timeout")
    if name is not None and (not isinstance(name, str) or not name or "." in name or len(name) > 100):
        raise ValueError(f"job name must be non-empty text without dots, at most 100 characters; got {name!r}")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise TypeError(f"retry must be a RetryPolicy, got {retry!r}")

    def register(handler: Handler) -> Job:
        if not callable(handler):
            raise TypeError(f"@job decorates a callable, got {handler!r}")
        module = _app_label_for(handler.__module__)
        return add(Job(handler, module=module, name=name or handler.__name__, retry=retry, lease=length, timeout=limit))

    return register


def add(entry: Job, *, replace: bool = False) -> Job:
    """Register ``entry`` under its key and return it.

    A key taken by another handler raises :class:`AlreadyRegistered`, unless
    the same definition is executed again (a module reload) or ``replace``
    (an internal job refreshed from its settings).
    """
    with _lock:
        existing = _jobs.get(entry.key)
        if existing is not None and not replace and not _same_definition(existing.handler, entry.handler):
            raise AlreadyRegistered(
                f"job {entry.label!r} is already registered by "
                f"{existing.handler.__module__}.{existing.handler.__qualname__}"
            )
        _jobs[entry.key] = entry
    return entry


def _same_definition(a: Handler, b: Handler) -> bool:
    return a is not b and (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


def get_job(ref: Job | str | Callable[..., Any]) -> Job:
    """Resolve a job object or an ``"app_label.name"`` string to its registration."""
    if isinstance(ref, Job):
        registered = _jobs.get(ref.key)
        if registered is None:
            raise UnknownJob(f"job {ref.label!r} is not registered")
        return registered
    if isinstance(ref, str):
        module, dot, name = ref.partition(".")
        if not dot or not module or not name:
            raise UnknownJob(f"{ref!r} does not name a job: write it as 'app_label.job_name'")
        registered = _jobs.get((module, name))
        if registered is None:
            known = ", ".join(sorted(j.label for j in _jobs.values())) or "none"
            raise UnknownJob(
                f"no job is registered as {ref!r} (registered: {known}). Jobs are registered when Django imports "
                "each installed app's jobs.py: define the @job there, or import its module from there"
            )
        return registered
    raise UnknownJob(f"{ref!r} is not a job: pass a function decorated with @job or an 'app_label.name' string")


def lookup(module: str, name: str) -> Job | None:
    """Return the job registered under ``(module, name)``, or ``None``."""
    return _jobs.get((module, name))


def registered_jobs() -> list[Job]:
    """Return every registered job, in key order."""
    return [_jobs[key] for key in sorted(_jobs)]


def unregister(ref: Job | str) -> None:
    """Forget a registration (for tests that define jobs on the fly)."""
    entry = get_job(ref)
    with _lock:
        _jobs.pop(entry.key, None)
