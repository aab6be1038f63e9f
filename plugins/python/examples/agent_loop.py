#!/usr/bin/env python3
"""An agent loop whose model stream breaks, and a user who never sees a token twice.

The model is a fake, OpenAI-shaped provider (chunks with ``choices[0].delta``) that fails the
way real ones do:

  turn 1   a 429 with Retry-After: 1 after 30 chunks, then a connection reset after 10 more;
           the answer continues from the text already shown (R1), never from its start
  turn 2   a huge ``write_file`` tool call whose arguments stall twice in a row (R3, then the
           planner's ``split_tool_call`` hint: the turn is abandoned instead of looping)
  turn 3   told to split, the model writes the file in two smaller calls; the agent runs them,
           recording each in the run log (``run.tool_begin`` / ``run.tool_end``)
  turn 4   the final answer

Run it against a daemon (``holdfast daemon`` in another terminal, after ``holdfast init``)::

    python3 plugins/python/examples/agent_loop.py            # the demo, rendered as a UI would
    python3 plugins/python/examples/agent_loop.py --jsonl    # one JSON line per rendered event

A process killed in the middle of a stream and a new one taking over (``--scenario long
--slow 0.02``, kill it, then ``--resume RUN_ID --after-seq N``, N being the last seq the old
one rendered) together render the answer exactly once: that is what the test checks.
"""

import argparse
import json
import os
import re
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from holdfast_client import Client  # noqa: E402
from holdfast_client.streaming import RecoveringStream, SplitToolCall, StreamFailed  # noqa: E402

ANSWER = (
    "Holdfast keeps every delta of this answer durable before it is shown, so when the "
    "provider says 429 or the connection drops, the stream continues from the text you "
    "already read instead of starting over. You read each word once: the partial answer is "
    "never followed by the whole answer again, and a refresh shows the stored message, not "
    "a replay. The same holds when the agent process itself is killed and another takes "
    "the run over from its checkpoint."
)
FINAL = "Done: the report is written, in two parts, and each write ran exactly once."
LONG = " ".join("word%03d" % i for i in range(300))


class RateLimited(Exception):
    """What an SDK raises for a 429: a status and the response's headers."""

    def __init__(self, retry_after):
        super().__init__("429 Too Many Requests: rate limit reached, retry later")
        self.status_code = 429
        self.headers = {"retry-after": retry_after}


def chunk(content=None, tool_calls=None, finish=None):
    delta = {}
    if content is not None:
        delta["content"] = content
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def words(text):
    """The words of ``text``, each with the spaces after it (joined: ``text`` again)."""
    return re.findall(r"\S+\s*|\s+", text)


class FakeModel:
    """A scripted model. ``stream(messages, prefix)`` answers the last user message; with a
    ``prefix`` (an assistant prefill) it continues right after it. Failures are scripted per
    turn and attempt."""

    def __init__(self, slow=0.0):
        self.slow = slow
        self.calls = []

    def stream(self, turn, prefix=None, messages=()):
        attempt = sum(1 for t in self.calls if t == turn)
        self.calls.append(turn)
        if turn == "explain":
            return self._text(ANSWER, prefix, fail_after={0: (30, RateLimited("1")),
                                                          1: (10, ConnectionResetError(
                                                              "connection reset by peer"))}
                              .get(attempt))
        if turn == "write":
            return self._write_huge(prefix)
        if turn == "write-split":
            return self._write_split()
        if turn == "final":
            return self._text(FINAL, prefix)
        if turn == "long":
            return self._text(LONG, prefix)
        raise ValueError("no such turn: %s" % turn)

    def _pause(self):
        if self.slow:
            time.sleep(self.slow)

    def _text(self, text, prefix, fail_after=None):
        start = len(prefix) if prefix and text.startswith(prefix) else 0
        n = 0
        for w in words(text[start:]):
            if fail_after and n == fail_after[0]:
                raise fail_after[1]
            self._pause()
            yield chunk(content=w)
            n += 1
        yield chunk(finish="stop")

    def _write_huge(self, prefix):
        """Text, then a write_file whose arguments stop coming (a read timeout)."""
        if not prefix:
            for w in words("I will write the report now. "):
                yield chunk(content=w)
        call = "call_big_%s" % uuid.uuid4().hex[:6]
        yield chunk(tool_calls=[{"index": 0, "id": call, "type": "function",
                                 "function": {"name": "write_file", "arguments": ""}}])
        yield chunk(tool_calls=[{"index": 0, "function": {
            "arguments": '{"path": "report.md", "content": "' + "lorem ipsum " * 20}}])
        raise TimeoutError("the stream went idle while the write_file arguments were coming")

    def _write_split(self):
        for w in words("Writing the report in two parts. "):
            yield chunk(content=w)
        for i, part in enumerate(("part one of the report", "part two of the report")):
            args = json.dumps({"path": "report.md", "append": i > 0, "content": part})
            yield chunk(tool_calls=[{"index": i, "id": "call_part%d" % i, "type": "function",
                                     "function": {"name": "write_file", "arguments": ""}}])
            for k in range(0, len(args), 16):
                yield chunk(tool_calls=[{"index": i, "function": {"arguments": args[k:k + 16]}}])
        yield chunk(finish="tool_calls")


class Renderer:
    """What a UI does with the events: text appended, a reset clears the turn."""

    def __init__(self, jsonl):
        self.jsonl = jsonl

    def event(self, run_id, ev):
        if self.jsonl:
            print(json.dumps({"run": run_id, "seq": ev.seq, "type": ev.type, "text": ev.text,
                              "data": ev.data}), flush=True)
            return
        if ev.type == "text":
            sys.stdout.write(ev.text)
            sys.stdout.flush()
        elif ev.type == "stream_reset":
            sys.stdout.write("\n[the turn starts over]\n")
        elif ev.type == "tool_call_cancel":
            sys.stderr.write("\n[tool call %s cut off: cancelled]\n" % ev.data.get("name"))
        elif ev.type == "interrupted":
            d = ev.data
            sys.stderr.write("\n[%s: %s, waiting %.1f s]\n" % (
                d.get("cause"), d.get("plan"), (d.get("wait_ms") or 0) / 1000))
        elif ev.type == "finish":
            sys.stdout.write("\n")

    def note(self, **fields):
        if self.jsonl:
            print(json.dumps({"note": fields}), flush=True)
        elif "final" in fields:
            final = fields["final"] or {}
            plans = ", ".join("%s after %s (waited %d ms)" % (p["plan"], p["cause"], p["wait_ms"])
                              for p in fields["plans"]) or "none needed"
            calls = len(final.get("tool_calls") or [])
            sys.stderr.write("[%s committed: %d characters%s; recoveries: %s]\n" % (
                fields["run"], len(final.get("content") or ""),
                ", %d tool call(s)" % calls if calls else "", plans))
        elif "split_tool_call" in fields:
            sys.stderr.write("[%s kept stalling; the model is told: %s]\n"
                             % (fields["split_tool_call"], fields["hint"]))
        else:
            sys.stderr.write("[ran %s %s: %s]\n" % (fields["tool"], fields["id"],
                                                     fields["result"]))


def run_turn(hf, model, ui, run_id, turn, resume=False, after_seq=0):
    rs = RecoveringStream(
        hf, run_id, None if resume else model.stream(turn),
        reopen=lambda prefix: model.stream(turn, prefix),
        model="fake-1", resume=resume, after_seq=after_seq,
    )
    for ev in rs:
        ui.event(run_id, ev)
    ui.note(run=run_id, final=rs.final_message, rendered=rs.text,
            plans=[{"plan": p["plan"], "cause": p["cause"], "wait_ms": p["wait_ms"]}
                   for p in rs.plans])
    return rs


def demo(hf, model, ui, prefix):
    run_turn(hf, model, ui, prefix + "-explain", "explain")
    try:
        run_turn(hf, model, ui, prefix + "-write", "write")
    except SplitToolCall as e:
        # The hint goes to the model; a new turn asks for the write again.
        ui.note(split_tool_call=e.tool, hint=e.message)
    rs = run_turn(hf, model, ui, prefix + "-write-split", "write-split")
    for call in rs.tool_calls:
        hf.run_tool_begin(prefix + "-write-split", call["id"], call["name"], call["arguments"])
        result = "wrote %d characters" % len(call["arguments"]["content"])
        hf.run_tool_end(prefix + "-write-split", call["id"], result)
        ui.note(tool=call["name"], id=call["id"], result=result)
    run_turn(hf, model, ui, prefix + "-final", "final")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", help="the daemon's socket (default: as the CLI finds it)")
    ap.add_argument("--jsonl", action="store_true", help="one JSON line per rendered event")
    ap.add_argument("--scenario", choices=["demo", "long"], default="demo")
    ap.add_argument("--run-id", help="run id (prefix for the demo's runs)")
    ap.add_argument("--slow", type=float, default=0.0, help="seconds between chunks")
    ap.add_argument("--resume", metavar="RUN_ID", help="take over RUN_ID (its producer died)")
    ap.add_argument("--after-seq", type=int, default=0,
                    help="with --resume: the last seq already rendered")
    a = ap.parse_args(argv)
    ui = Renderer(a.jsonl)
    model = FakeModel(a.slow)
    with Client(a.socket, client="agent-loop-example") as hf:
        try:
            if a.resume:
                run_turn(hf, model, ui, a.resume, "long", resume=True, after_seq=a.after_seq)
            elif a.scenario == "long":
                run_turn(hf, model, ui, a.run_id or "long-%s" % uuid.uuid4().hex[:8], "long")
            else:
                demo(hf, model, ui, a.run_id or "demo-%s" % uuid.uuid4().hex[:8])
        except StreamFailed as e:
            print("the stream failed: %s" % e, file=sys.stderr)
            return 1
        except BrokenPipeError:
            # The reader went away (`| head`): stop quietly; the run stays resumable.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
