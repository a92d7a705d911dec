"""The client's calls about thousands of keys, read and written without a model per key.

- :meth:`BulkCalls.listing` and :meth:`BulkCalls.prepare_listing`: a status or a prepare as a
  :class:`~rl_gym_actors.listing.GymListing` (each active attempt once). A server that offers
  the (ext) ``status-compact`` feature is asked for the compact listing (columns, receipts as
  JSON objects, parsed in one ``json.loads``; where it offers ``status-receipt-text``, receipts
  as the JSON text it issued, not even decoded); any other (a real Gym) answers the full status,
  read as :meth:`~rl_gym_actors.gym.agent_checkpoint.client.GymClient.status` reads it.
- :meth:`BulkCalls.acknowledge_wire`: ``acknowledge-completed`` with receipts as a listing gave
  them (sent back as they came, JSON text spliced into the body; the server checks each against
  the one it issued), its answer checked key by key without models.

Mixed into :class:`~rl_gym_actors.gym.agent_checkpoint.client.GymClient`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from rl_gym_actors.config import checkpoint_id_arg
from rl_gym_actors.errors import ConfigError, ProtocolViolation
from rl_gym_actors.gym.answers import build_request, encode, error_for_response, json_of
from rl_gym_actors.gym.retry import RetryOn
from rl_gym_actors.gym.transport import GymTransport
from rl_gym_actors.listing import (
    ACK_COUNT_FEATURE,
    ACK_COUNT_PARAM,
    ACK_ENDS,
    COMPACT_FEATURE,
    COMPACT_PARAM,
    KEYS_LISTING,
    TEXT_FEATURE,
    TEXT_LISTING,
    AnyReceipt,
    GymListing,
    receipt_json,
    receipt_key,
)
from rl_gym_actors.protocol import CONTROL_PREFIX, PhaseRequest, StatusReport

_PARAMS = {COMPACT_PARAM[0]: COMPACT_PARAM[1]}


def _loads(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


class BulkCalls(GymTransport):
    """Listings and wire-form ACKs (see the module docstring)."""

    async def _send_prepare(
        self, checkpoint_id: str, try_deadline: float, *, params: Mapping[str, str] | None = None
    ) -> Any:
        """One ``POST .../prepare`` try (the server holds it until ready or its deadline)."""
        body = build_request(
            PhaseRequest, checkpoint_id=checkpoint_id, deadline_ts=self.wire_deadline(try_deadline)
        )
        return await self._send(
            "POST",
            CONTROL_PREFIX + "/prepare",
            control=True,
            waits=True,
            data=encode(body.model_dump(mode="json")),
            params=params,
            deadline_ts=try_deadline,
        )

    # GymClient's own, used here
    offers: Callable[..., Awaitable[bool]]
    status: Callable[..., Awaitable[StatusReport]]
    prepare: Callable[..., Awaitable[StatusReport]]

    async def listing(self, checkpoint_id: str, *, deadline_ts: float) -> GymListing:
        """The status for ``checkpoint_id``, each active attempt once."""
        if not await self.offers(COMPACT_FEATURE, deadline_ts=deadline_ts):
            return GymListing.of(await self.status(checkpoint_id, deadline_ts=deadline_ts))
        checkpoint_id_arg(checkpoint_id)
        text = await self.offers(TEXT_FEATURE, deadline_ts=deadline_ts)
        listing = {COMPACT_PARAM[0]: TEXT_LISTING} if text else _PARAMS
        params = {"checkpoint_id": checkpoint_id, **listing}

        async def attempt(try_deadline: float) -> GymListing:
            answer = await self._send(
                "GET",
                CONTROL_PREFIX + "/status",
                control=True,
                params=params,
                deadline_ts=try_deadline,
            )
            if not 200 <= answer.status < 300:
                raise error_for_response(answer.status, answer.raw, url=answer.url)
            return self._compact(json_of(answer), answer.url, text=text)

        return await self._with_retry(attempt, RetryOn.IDEMPOTENT, deadline_ts, "status")

    async def prepare_listing(
        self, checkpoint_id: str, *, deadline_ts: float, keys_only: bool = False
    ) -> GymListing:
        """:meth:`GymClient.prepare` as a listing: not ready is ``ready_to_commit`` False with
        the attempts left (from the 409's compact report where the server offers it; with
        ``keys_only``, our server leaves the receipts out: every one None)."""
        if not await self.offers(COMPACT_FEATURE, deadline_ts=deadline_ts):
            return GymListing.of(await self.prepare(checkpoint_id, deadline_ts=deadline_ts))
        checkpoint_id_arg(checkpoint_id)

        async def attempt(try_deadline: float) -> GymListing:
            answer = await self._send_prepare(
                checkpoint_id,
                try_deadline,
                params={COMPACT_PARAM[0]: KEYS_LISTING} if keys_only else _PARAMS,
            )
            if 200 <= answer.status < 300:
                return GymListing.of(self._report(json_of(answer), answer.url))
            refusal = _loads(answer.raw) if answer.status == 409 else None
            if (
                isinstance(refusal, dict)
                and isinstance(refusal.get("error"), dict)
                and refusal["error"].get("code") == "agent_prepare_incomplete"
                and isinstance(refusal.get("report"), dict)
            ):
                return self._compact(refusal["report"], answer.url, keys_only).not_ready()
            raise error_for_response(answer.status, answer.raw, url=answer.url)

        return await self._with_retry(
            attempt, RetryOn.TRANSPORT, deadline_ts, f"prepare {checkpoint_id}"
        )

    async def acknowledge_wire(
        self,
        receipts: Sequence[AnyReceipt],
        *,
        deadline_ts: float,
        keys: Sequence[tuple[str, int]] | None = None,
    ) -> list[tuple[str, int]]:
        """ACK a batch of receipts as a listing gave them, all or nothing; the keys ACKed.
        ``keys``: the receipts' keys where the caller knows them (a receipt's JSON text is then
        not decoded: the server checks it). Raises as :meth:`GymClient.acknowledge_completed`
        does (``AckRejected`` for a stale receipt)."""
        sent = list(keys) if keys is not None else [receipt_key(r) for r in receipts]
        unique = set(sent)
        if not unique or len(unique) != len(sent) or len(sent) != len(receipts):
            raise ConfigError("acknowledge-completed: at least one receipt, keys unique")
        try:  # the body as our server compares it whole with the receipts it issued
            data = ",".join(map(receipt_json, receipts)).join(ACK_ENDS).encode()
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"acknowledge-completed: a receipt is not JSON: {exc}") from exc
        # (ext) the count instead of every receipt sent back, where the server offers it
        count = await self.offers(ACK_COUNT_FEATURE, deadline_ts=deadline_ts)

        async def attempt(try_deadline: float) -> list[tuple[str, int]]:
            answer = await self._send(
                "POST",
                CONTROL_PREFIX + "/acknowledge-completed",
                control=True,
                data=data,
                params=dict([ACK_COUNT_PARAM]) if count else None,
                deadline_ts=try_deadline,
            )
            if not 200 <= answer.status < 300:
                raise error_for_response(answer.status, answer.raw, url=answer.url)
            body = json_of(answer)
            if count:
                if not isinstance(body, dict) or body.get("acknowledged_count") != len(sent):
                    raise ProtocolViolation(f"{answer.url}: acknowledge-completed: {body!r}")
                return sent
            acked = body.get("acknowledged") if isinstance(body, dict) else None
            if not isinstance(acked, list) or not all(isinstance(r, dict) for r in acked):
                raise ProtocolViolation(f"{answer.url}: acknowledge-completed answered {body!r}")
            got = {(r.get("rollout_id"), r.get("attempt_index")) for r in acked}
            if not got <= unique:
                raise ProtocolViolation(
                    f"{self.endpoint.label}: acknowledge-completed answered keys it was not sent"
                )
            return [k for k in sent if k in got]

        return await self._with_retry(
            attempt, RetryOn.IDEMPOTENT, deadline_ts, "acknowledge-completed"
        )

    @staticmethod
    def _report(body: Any, url: str) -> StatusReport:
        try:
            return StatusReport.model_validate(body)
        except ValueError as exc:
            raise ProtocolViolation(f"{url}: answer is no StatusReport: {exc}") from exc

    @staticmethod
    def _compact(body: Any, url: str, keys_only: bool = False, text: bool = False) -> GymListing:
        if not isinstance(body, dict):
            raise ProtocolViolation(f"{url}: a compact listing is no JSON object")
        try:
            return GymListing.from_compact(body, keys_only=keys_only, text=text)
        except ValueError as exc:
            raise ProtocolViolation(f"{url}: not a compact listing: {exc}") from exc
