"""SGLang's sessions: /open_session, /close_session and `session_params` on /generate.

A session remembers, per request id, the full token sequence of each finished request (its
input and output). A new request names the saved point it continues from (`rid`), optionally
cut at `offset` or without the previous output, and its input_ids are appended. Several
requests may continue from the same point (branches); `replace` drops the branches below it.

While the session is open, the KV of every saved point stays locked in the radix cache, so a
continuation only computes its new tokens (the prefix is a cache hit). Closing the session
unlocks them (they become ordinary, evictable cache entries).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixserve.managers.kv_manager import KVManager
    from radixserve.managers.schedule_batch import Req

from radixserve.managers.session_params import SessionError, SessionParams

logger = logging.getLogger(__name__)


@dataclass
class SessionNode:
    rid: str
    parent: str | None
    input_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    finished: bool = False
    children: list[str] = field(default_factory=list)
    lock: Any = None  # the radix node this point keeps locked


@dataclass
class Session:
    session_id: str
    capacity_of_str_len: int | None
    nodes: dict[str, SessionNode] = field(default_factory=dict)


class SessionController:
    def __init__(self, kv: KVManager, bos_token_id: int | None) -> None:
        self.kv = kv
        self.bos_token_id = bos_token_id
        self.sessions: dict[str, Session] = {}

    # -- open / close -----------------------------------------------------------------------
    def open(self, session_id: str | None, capacity_of_str_len: int | None) -> str:
        sid = session_id or uuid.uuid4().hex
        if sid in self.sessions:
            raise SessionError(f"Session {sid} is already open.")
        self.sessions[sid] = Session(sid, capacity_of_str_len)
        return sid

    def close(self, session_id: str) -> list[str]:
        """Forget the session and unlock its saved KV; returns the rids still running in it."""
        session = self.sessions.pop(session_id, None)
        if session is None:
            raise SessionError(f"Session {session_id} does not exist.")
        live = []
        for node in session.nodes.values():
            self._unlock(node)
            if not node.finished:
                live.append(node.rid)
        return live

    def forget_locks(self) -> None:
        """After the KV bookkeeping was reset (a failed step) the locked nodes are gone."""
        for session in self.sessions.values():
            for node in session.nodes.values():
                node.lock = None

    def unlock_all(self) -> None:
        """Give up every saved point's cache lock (the cache is about to be dropped); the
        sessions keep their tokens, so continuations still work, recomputing the prefix."""
        for session in self.sessions.values():
            for node in session.nodes.values():
                self._unlock(node)

    def holds_locks(self) -> bool:
        return any(n.lock is not None for s in self.sessions.values() for n in s.nodes.values())

    # -- requests ---------------------------------------------------------------------------
    def build_input(
        self, rid: str, raw_params: Any, new_ids: list[int]
    ) -> tuple[list[int], list[str]]:
        """The request's full input ids, registering it in its session; also the rids of
        requests `replace` cut off (the caller aborts them). Raises SessionError."""
        params = SessionParams.parse(raw_params)
        session = self.sessions.get(params.id)
        if session is None:
            raise SessionError(f"Session {params.id} does not exist.")
        if rid in session.nodes:
            raise SessionError(f"Request id {rid} is already used in session {params.id}.")
        doomed: list[str] = []
        parent: SessionNode | None = None
        if params.rid is not None:
            parent = session.nodes.get(params.rid)
            if parent is None:
                raise SessionError(f"Request {params.rid} is not in session {params.id}.")
        if params.replace:
            roots = (
                [parent]
                if parent is not None
                else [n for n in session.nodes.values() if n.parent is None]
            )
            for node in roots:
                doomed += self._drop_children(session, node)
            if parent is None:
                for node in roots:
                    doomed += self._drop(session, node)
        if parent is not None and not parent.finished:
            raise SessionError(f"Request {params.rid} of session {params.id} has not finished.")
        ids = list(new_ids)
        if parent is None:
            full = ids
        else:
            if self.bos_token_id is not None and ids and ids[0] == self.bos_token_id:
                ids = ids[1:]  # appending: the new text's BOS would sit mid-sequence
            base = list(parent.input_ids)
            if not params.drop_previous_output:
                base += parent.output_ids
            if params.offset:
                base = base[: params.offset]
            full = base + ids
            parent.children.append(rid)
        session.nodes[rid] = SessionNode(rid, parent.rid if parent is not None else None)
        return full, doomed

    def on_finish(self, req: Req, computed_len: int) -> None:
        """Save a finished session request's tokens and lock their cached KV. Call right after
        the request's KV went to the cache (computed_len: its kv_len before release)."""
        session = self.sessions.get(req.session_id or "")
        node = session.nodes.get(req.rid) if session is not None else None
        if session is None or node is None:
            return
        reason = req.finished_reason
        if reason is not None and reason.type == "abort":
            self._drop(session, node)  # nothing to continue from
            return
        node.input_ids = list(req.origin_input_ids)
        node.output_ids = list(req.output_ids)
        node.finished = True
        cache = self.kv.prefix_cache
        if cache.stores_kv and computed_len > 0:
            match = cache.match_prefix(req.fill_ids[:computed_len], update_stats=False)
            cache.inc_lock_ref(match.last_node)
            node.lock = match.last_node

    # -- internals --------------------------------------------------------------------------
    def _unlock(self, node: SessionNode) -> None:
        if node.lock is not None:
            self.kv.prefix_cache.dec_lock_ref(node.lock)
            node.lock = None

    def _drop_children(self, session: Session, node: SessionNode) -> list[str]:
        doomed: list[str] = []
        for child_rid in list(node.children):
            child = session.nodes.get(child_rid)
            if child is not None:
                doomed += self._drop(session, child)
        node.children = []
        return doomed

    def _drop(self, session: Session, node: SessionNode) -> list[str]:
        """Remove `node` and everything below it; the rids among them still running."""
        doomed = self._drop_children(session, node)
        self._unlock(node)
        session.nodes.pop(node.rid, None)
        if node.parent is not None and node.parent in session.nodes:
            siblings = session.nodes[node.parent].children
            if node.rid in siblings:
                siblings.remove(node.rid)
        if not node.finished:
            doomed.append(node.rid)
        return doomed
