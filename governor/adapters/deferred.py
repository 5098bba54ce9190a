"""What the adapters remember across exchanges: work that happens after its request is answered.

Most model calls are over when their answer is: the call's reservation is settled by the
usage in the answer and released at the exchange's end. The asynchronous endpoints are not
(docs/reference/async.md): a file uploaded for a batch is used by a later request that names
it by id; a batch, a background response, an Assistants run or a fine-tuning job is answered
at once (`queued`) and does its work later, its usage readable (if at all) from a later read.

The governor's rule for them: the submission is charged its whole reservation at once, when
its answer accepts the work (conservative: the ticket of the submitting exchange is settled
with its own reservation, so nothing has to outlive the exchange in the runtime or the store,
and the decision point stays as it is); a later read of the finished resource whose usage
exceeds what was charged is charged the excess, as a usage report of the read's own step.
A usage below the charge is not credited back: the counters only grow (the store has no
decrement, and a refund an agent could trigger by reading is one more thing to trust).

`DeferredWork` is that memory: what an uploaded file declares, what each submission was
charged, which model an assistant runs. Keyed by upstream host and the provider's id (the
same id at another host is another resource: an agent's own server cannot vouch for a file
at the provider). Bounded: the oldest entries are forgotten first, and a request naming a
file the governor does not remember is refused (fail closed), as for one it never saw.
One instance per adapter registry, handed to the adapters that remember (`Adapter.remembers`)
in their constructors; the proxy runs on one event loop, so it needs no lock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

from governor.policy.steps import UsageReport

# Entries kept per kind (files, charges, assistants' models): about 200 bytes each.
MAX_ENTRIES = 20_000

# The statuses after which a resource does no more work (OpenAI batches, responses, runs and
# fine-tuning jobs): its usage, when it carries one, is its final figure.
TERMINAL = frozenset({"completed", "failed", "cancelled", "expired", "incomplete", "succeeded"})



def finished(status: object) -> bool:
    """A resource's `status` says it does no more work (an upstream's JSON: any type)."""
    return isinstance(status, str) and status in TERMINAL


Key = tuple[str, str]
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class DeclaredFile:
    """What an upload through the governor declared, read from its bytes."""

    purpose: str
    size: int  # bytes of the file
    lines: int = 0  # non-blank JSONL lines (batch and fine-tune files)
    model: str = ""  # batch files: the one model their requests name
    endpoint: str = ""  # batch files: the endpoint their requests name (e.g. /v1/chat/completions)
    input_tokens: int = 0  # batch files: every request's expected input, as its adapter estimates it
    output_tokens: int = 0  # batch files: every request's expected output


@dataclass(slots=True)
class Charged:
    """What a submission was charged, and the names its resource reports usage under."""

    model: str
    input_tokens: int
    output_tokens: int
    usage_names: tuple[str, str]  # (input, output) fields of the resource's `usage`


class _Bounded(Generic[V]):
    """An insertion-ordered map that forgets its oldest entries past `limit`."""

    __slots__ = ("_items", "_limit")

    def __init__(self, limit: int) -> None:
        self._items: OrderedDict[Key, V] = OrderedDict()
        self._limit = limit

    def put(self, key: Key, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self._limit:
            self._items.popitem(last=False)

    def get(self, key: Key) -> V | None:
        return self._items.get(key)

    def pop(self, key: Key) -> V | None:
        return self._items.pop(key, None)

    def __len__(self) -> int:
        return len(self._items)


class DeferredWork:
    """The adapters' memory of asynchronous work (see the module's docstring)."""

    def __init__(self, limit: int = MAX_ENTRIES) -> None:
        self.files: _Bounded[DeclaredFile] = _Bounded(limit)
        self.charges: _Bounded[Charged] = _Bounded(limit)
        self.models: _Bounded[str] = _Bounded(limit)

    # --- files uploaded through the governor ---------------------------------------------

    def remember_file(self, host: str, file_id: str, declared: DeclaredFile) -> None:
        self.files.put((host.lower(), file_id), declared)

    def file(self, host: str, file_id: str) -> DeclaredFile | None:
        return self.files.get((host.lower(), file_id))

    # --- assistants' models --------------------------------------------------------------

    def remember_model(self, host: str, assistant_id: str, model: str) -> None:
        self.models.put((host.lower(), assistant_id), model)

    def model_of(self, host: str, assistant_id: str) -> str | None:
        return self.models.get((host.lower(), assistant_id))

    # --- submissions charged at once -----------------------------------------------------

    def charge(self, host: str, resource_id: str, model: str, input_tokens: int, output_tokens: int,
               usage_names: tuple[str, str]) -> None:
        """A submission was charged: remember it (added to what the resource was charged
        before: a run's tool outputs continue it)."""
        key = (host.lower(), resource_id)
        before = self.charges.get(key)
        if before is not None:
            input_tokens += before.input_tokens
            output_tokens += before.output_tokens
        self.charges.put(key, Charged(model, input_tokens, output_tokens, usage_names))

    def submitted(self, host: str, resource_id: str, model: str, input_tokens: int, output_tokens: int,
                  usage_names: tuple[str, str], persona: str | None) -> UsageReport:
        """A submission whose answer accepted the work: charged its whole reservation now
        (the report its ticket is settled with), and remembered for the read that settles it."""
        self.charge(host, resource_id, model, input_tokens, output_tokens, usage_names)
        return charged_report(model, input_tokens, output_tokens, persona)

    def charged(self, host: str, resource_id: str) -> Charged | None:
        return self.charges.get((host.lower(), resource_id))

    def settle(self, host: str, resource_id: str, resource: dict, persona: str | None) -> UsageReport | None:
        """A read of `resource` (the provider's object for `resource_id`): when it is finished
        and reports its usage, the usage past what its submission was charged, as a final
        report (each term on its own: input over the input charged, output over the output
        charged), and the resource is forgotten (a second read charges nothing). None: not
        finished, no usage, never charged here, or within the charge (nothing is credited)."""
        key = (host.lower(), resource_id)
        charged = self.charges.get(key)
        if charged is None or not finished(resource.get("status")):
            return None
        usage = resource.get("usage")
        if not isinstance(usage, dict):
            return None
        self.charges.pop(key)
        inputs, outputs = charged.usage_names
        extra_in = max(count(usage.get(inputs)) - charged.input_tokens, 0)
        extra_out = max(count(usage.get(outputs)) - charged.output_tokens, 0)
        if not extra_in and not extra_out:
            return None
        return UsageReport(model=charged.model, input_tokens=extra_in, output_tokens=extra_out, persona=persona,
                           final=True)


def count(value: object) -> int:
    """A token count from an upstream's JSON: a non-negative integer, else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def charged_report(model: str, input_tokens: int, output_tokens: int, persona: str | None) -> UsageReport:
    """The final report a submission is settled with: its whole reservation."""
    return UsageReport(model=model, input_tokens=input_tokens, output_tokens=output_tokens, persona=persona,
                       final=True)


__all__ = ["Charged", "DeclaredFile", "DeferredWork", "MAX_ENTRIES", "TERMINAL", "charged_report", "count", "finished"]
