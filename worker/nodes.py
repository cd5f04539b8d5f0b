"""One node of a multi-host run: the Celery task `paralab.node(run_id, node)` that the placer
sends to this worker's own queue (backend/services/placement.py), and its supervisor.

Each placed worker claims its node (atomic: a redelivered message never launches a node twice)
and launches torchrun with the run's c10d rendezvous: node 0's worker picks a free port on its
address and publishes the endpoint; the others wait for it. Each node is supervised here as a
one-host run is (timeout, hang watch, cancel through its heartbeat, stacks, SIGKILL of what is
left), ships its own log lines (the backend numbers them for the run) and uploads its own files.
A node that fails tells the backend, which stops the others at their next heartbeat; a node
whose worker dies stops reporting and the backend's reaper fails the run as "host X lost".
Node 0's worker then waits for every node to end, gathers the files the others uploaded,
analyses the whole run and reports its outcome (docs/hosts.md).
"""

from __future__ import annotations

import logging
import socket
import time

from celery import shared_task

from jobs.ckpt_index import attempts
from paralab_core.config import Settings, get_settings
from paralab_core.queue import NODE_TASK_NAME
from worker.hang import post_mortem
from worker.launch import Rendezvous
from worker.provenance import provenance
from worker.tasks import JobSupervisor, _client, busy, worker_name

log = logging.getLogger(__name__)

NODE_ACTIVE = ("reserved", "running")
# how a run ends from its nodes' outcomes: the first of these any node has
PRECEDENCE = ("lost", "hung", "timed_out", "failed", "cancelled")
GATHER_SKIP = ("spec.json",)  # the same on every node
GATHER_SKIP_DIRS = ("checkpoints/",)  # every node's shards stay in the backend's copy


@shared_task(name=NODE_TASK_NAME, bind=True, acks_late=True)
def run_node(self, run_id: str, node: int) -> str:
    settings = get_settings()
    client = _client(settings)
    try:
        claim = client.claim_node(run_id, int(node), worker_name(settings), self.request.id)
        if not claim["launch"]:
            log.info("run %s node %s not launched: %s", run_id, node, claim["reason"])
            return f"skipped: {claim['reason']}"
        with busy():
            return NodeSupervisor(run_id, int(node), claim["spec"], client, settings).run()
    finally:
        client.close()


def worker_address(settings: Settings) -> str:
    if settings.worker_address:
        return settings.worker_address
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def free_port(addr: str) -> int:
    """A port free on `addr` now; torch's rendezvous store binds it moments later (another
    process taking it in between fails the launch, reported as the node's failure)."""
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def run_outcome(own: str, nodes: list[dict], cancel: bool) -> tuple[str, int | None]:
    """The run's status from every node's, and the node that decided it (None: all agree):
    of the nodes with the gravest outcome, the first to end (the others usually failed
    because it did: a peer's collective broke)."""
    for status in PRECEDENCE:
        hit = sorted((n for n in nodes if n["status"] == status),
                     key=lambda n: (n.get("finished_at") or "~", n["node"]))
        if hit:
            return ("failed" if status == "lost" else status), hit[0]["node"]
    if own != "succeeded":
        return own, 0
    return ("cancelled", None) if cancel else ("succeeded", None)


class NodeSupervisor(JobSupervisor):
    def __init__(self, run_id: str, node: int, spec: dict, client, settings: Settings):
        super().__init__(run_id, spec, client, settings)
        self.node = node
        self.nnodes = int(spec["runtime"]["nnodes"])

    def _beat(self) -> dict | None:
        return self.client.node_heartbeat(self.run_id, self.node)

    def _join_timeout_s(self) -> int:
        return int(min(300.0, float(self.spec["runtime"]["timeout_s"])))

    def _rendezvous(self) -> Rendezvous:
        addr = worker_address(self.settings)
        rdzv_id = f"paralab-{self.run_id}"  # unique per run: a stale agent never joins
        if self.node == 0:
            endpoint = f"{addr}:{free_port(addr)}"
            self.client.set_endpoint(self.run_id, 0, endpoint)
            self.say(f"serving the rendezvous of {self.nnodes} hosts at {endpoint}")
            return Rendezvous(endpoint, rdzv_id, True, addr, self._join_timeout_s())
        deadline = time.monotonic() + self._join_timeout_s()
        while time.monotonic() < deadline:
            state = self.client.nodes(self.run_id)
            if state["cancel"] or state["status"] not in ("queued", "running"):
                raise RuntimeError(f"the run is {state['status']}: not joining")
            first = next((n for n in state["nodes"] if n["node"] == 0), None)
            if first and first["endpoint"]:
                self.say(f"joining the rendezvous at {first['endpoint']} (node 0 on "
                         f"{first['host']})")
                return Rendezvous(first["endpoint"], rdzv_id, False, addr,
                                  self._join_timeout_s())
            self._beat()
            time.sleep(0.2)
        raise RuntimeError(f"node 0 published no rendezvous endpoint within "
                           f"{self._join_timeout_s()} s")

    def _finish(self, status: str, rc: int, error: str | None, summary: dict | None) -> None:
        """A node that could not even launch (no checkpoint, no rendezvous)."""
        self.client.finish_node(self.run_id, self.node, status=status, exit_code=rc,
                                error=(error or "")[:20000] or None)
        if self.node == 0:
            self.client.finish(self.run_id, status=status, exit_code=rc, error=error,
                               summary=summary, provenance=None)

    def _report(self, status: str, rc: int, error: str | None, diagnosis: dict | None, *,
                early: bool) -> str:
        self._upload()
        self.client.finish_node(self.run_id, self.node, status=status, exit_code=rc,
                                error=(error or "")[:20000] or None)
        if self.node != 0:
            self.logs.close()
            return status
        nodes, cancel = self._wait_for_nodes()
        gathered = self._gather()
        run_status, by = run_outcome(status, nodes, cancel)
        run_error = None
        if run_status != "succeeded":
            row = next((n for n in nodes if n["node"] == by), None)
            if row is not None and by != 0:
                run_error = (f"node {by} on {row['host']} ended {row['status']}: "
                             f"{row['error'] or 'see its log lines'}")
            else:
                run_error = error or "cancelled by user"
            diagnosis = post_mortem(self.out, run_status, self.tail) or diagnosis
            if diagnosis and diagnosis.get("sentence"):
                run_error = f"{diagnosis['sentence']}\n\n{run_error}"
        # the analysis of every host's traces, gathered here, is the one home of what was
        # measured across hosts (stage bubbles, bytes per axis): the summary repeats none of it
        summary = self._analyze(self._summary())
        summary = {**(summary or {}), "nodes": [
            {k: n[k] for k in ("node", "host", "worker", "ranks", "status", "exit_code")}
            for n in nodes]}
        tries = attempts(self.out)
        if len(tries) > 1:
            summary["attempts"] = tries
        if diagnosis:
            summary["diagnosis"] = {k: v for k, v in diagnosis.items()
                                    if k not in ("stacks", "errors")}
        self._upload(skip=gathered)
        self.say(f"run finished: {run_status} (nodes: "
                 + ", ".join(f"{n['node']} {n['host']} {n['status']}" for n in nodes) + ")")
        self.logs.close()
        self.client.finish(self.run_id, status=run_status, exit_code=rc, error=run_error,
                           summary=summary,
                           provenance=provenance(summary.get("backend"),
                                                 summary.get("provenance")))
        return run_status

    def _wait_for_nodes(self) -> tuple[list[dict], bool]:
        """Every node's row once none is reserved or running: each reports its end, and the
        backend's reaper marks a silent one lost within its heartbeat timeout."""
        bound = 2 * self.settings.run_heartbeat_timeout_s + self.settings.kill_grace_s + 30
        deadline, said = time.monotonic() + bound, False
        while True:
            state = self.client.nodes(self.run_id)
            waiting = [n for n in state["nodes"] if n["node"] != 0
                       and n["status"] in NODE_ACTIVE]
            if not waiting or time.monotonic() > deadline:
                return state["nodes"], bool(state["cancel"])
            if not said:
                self.say("waiting for " + ", ".join(f"node {n['node']} on {n['host']}"
                                                    for n in waiting) + " to end")
                said = True
            self._beat()
            time.sleep(0.5)

    def _gather(self) -> set[str]:
        """The other nodes' files (traces, flight records, stacks, errors, their summary),
        downloaded next to this node's; returns their relative paths."""
        got = set()
        for f in self.client.run_files(self.run_id):
            rel = f["path"]
            if rel in GATHER_SKIP or rel.startswith(GATHER_SKIP_DIRS):
                continue
            dest = self.out / rel
            if dest.is_file():
                continue
            try:
                self.client.download(self.run_id, rel, dest)
                got.add(rel)
            except Exception as exc:  # noqa: BLE001 - one missing file must not lose the run
                self.say(f"could not gather {rel}: {exc}")
        if got:
            self.say(f"gathered {len(got)} files of the other nodes")
        return got
