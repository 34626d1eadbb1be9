"""Steps out of training log lines (stdlib only): the part of watchnode.py that reads ranks' output.

A metric regex is a Python regular expression with named groups: ``step`` (the step or iteration
number; without it every matching line counts as one step), and optionally ``total`` (steps in
all), ``time`` (the step's own duration) with ``unit`` (``s``, ``ms`` or ``us``; default seconds, or
the pattern's own), ``loss``, and ``rate`` with ``rate_unit`` (``it/s`` or ``s/it``, tqdm's).  The
user's regexes (``--metric-regex``) are tried first, then DEFAULT_PATTERNS; the first that matches a
line wins.  Only the first MATCH_CHARS characters of a line are looked at.
"""

import re
import time

MATCH_CHARS = 1024
NUM = r"[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?"
STEP = r"(?P<step>[0-9]+)(?![0-9.])"
# (name, regex, the unit of its time group when it has no unit group)
DEFAULT_PATTERNS = (
    ("megatron", r"iteration\s+" + STEP + r"\s*/\s*(?P<total>[0-9]+)\s*\|.*?elapsed time per iteration \(ms\):\s*"
     r"(?P<time>" + NUM + r")(?:.*?lm loss:\s*(?P<loss>" + NUM + "))?", "ms"),
    ("deepspeed", r"\bsteps:\s*" + STEP + r"\s+loss:\s*(?P<loss>" + NUM + r")\s+iter time \(s\):\s*(?P<time>"
     + NUM + ")", "s"),
    ("nanogpt", r"\biter " + STEP + r": loss (?P<loss>" + NUM + r"), time (?P<time>" + NUM + ")ms", "ms"),
    ("tqdm", STEP + r"/(?P<total>[0-9]+) \[[0-9:]+<[0-9:?]+,\s*(?P<rate>" + NUM + r")\s*(?P<rate_unit>it/s|s/it)", "s"),
    ("synthetic-benchmark", r"^Iter #" + STEP + r": " + NUM + " img/sec", "s"),
    ("step", r"(?i)\b(?:global[_ ])?(?:step|iteration|iter)\b[\s:=#]*" + STEP + r"(?:\s*/\s*(?P<total>[0-9]+))?"
     r"(?:.*?\bloss\b[\s:=]+(?P<loss>" + NUM + r"))?"
     r"(?:.*?\b(?:step_time|step time|time|dt)\b[\s:=]+(?P<time>" + NUM + r")\s*(?P<unit>ms|us|s)\b)?", "s"),
)
UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
KEEP_SEEN = 8   # step lines kept with the time they were seen (the live step rate)
KEEP_TIMES = 8  # step durations the lines reported


def compile_patterns(user=()):
    """[(name, compiled, default unit)]: the user's regexes first (named user-1 ...), then the defaults."""
    mine = [(f"user-{i + 1}", re.compile(text), "s") for i, text in enumerate(user)]
    return mine + [(name, re.compile(text), unit) for name, text, unit in DEFAULT_PATTERNS]


def match(line, patterns):
    """(pattern name, {step, total, time (s), loss, rate (steps/s)}) of the first pattern matching, or None."""
    text = line[:MATCH_CHARS]
    for name, regex, unit in patterns:
        m = regex.search(text)
        if m is None:
            continue
        g = {k: v for k, v in m.groupdict().items() if v not in (None, "")}
        out = {"step": int(g["step"]) if "step" in g else None, "total": int(g["total"]) if "total" in g else None,
               "loss": _float(g.get("loss")), "time": None, "rate": None}
        t = _float(g.get("time"))
        if t is not None:
            out["time"] = t * UNITS.get(g.get("unit") or unit, 1.0)
        r = _float(g.get("rate"))
        if r is not None and r > 0:
            out["rate"] = 1.0 / r if g.get("rate_unit") == "s/it" else r
        return name, out
    return None


def _float(text):
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def median(values):
    v = sorted(values)
    if not v:
        return None
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2.0


class RankSteps:
    """What one rank's lines said: its last step, when steps were seen, the durations it reported."""

    def __init__(self):
        self.step = self.total = self.loss = self.rate = self.pattern = None
        self.seen = []    # [(monotonic time seen, step)], live lines only
        self.times = []   # reported step durations (s), newest last
        self.counted = 0  # lines of a pattern without a step group

    def feed(self, line, now, patterns):
        """One line; ``now`` None for a line that was there before watching began (no arrival time)."""
        found = match(line, patterns)
        if found is None:
            return
        self.pattern, got = found
        step = got["step"]
        if step is None:
            self.counted += 1
            step = self.counted
        if self.step is not None and step < self.step:
            self.seen = []  # counted from the start again: a restart
        self.step, self.total = step, got["total"] or self.total
        self.loss = got["loss"] if got["loss"] is not None else self.loss
        if got["time"] is not None:
            self.times = (self.times + [got["time"]])[-KEEP_TIMES:]
        if got["rate"] is not None:
            self.rate = got["rate"]
        if now is not None and self.seen and self.seen[-1][0] == now:
            self.seen[-1] = (now, step)  # lines read in the same reading: the step it had reached by then
        elif now is not None and (not self.seen or self.seen[-1][1] != step):
            self.seen = (self.seen + [(now, step)])[-KEEP_SEEN:]

    def live_rate(self):
        if len(self.seen) < 2 or self.seen[-1][0] <= self.seen[0][0]:
            return None
        return (self.seen[-1][1] - self.seen[0][1]) / (self.seen[-1][0] - self.seen[0][0])

    def summary(self, now=None):
        """{step, total, loss, rate (steps/s), step_time (s), times (the last 3 reported), pattern}."""
        rate = self.live_rate() or self.rate
        step_time = median(self.times[-3:]) if self.times else (1.0 / rate if rate else None)
        if rate is None and step_time:
            rate = 1.0 / step_time
        return {"step": self.step, "total": self.total, "loss": self.loss,
                "rate": None if rate is None else round(rate, 4),
                "step_time": None if step_time is None else round(step_time, 6),
                "times": [round(t, 6) for t in self.times[-3:]], "pattern": self.pattern,
                "since_step": None if not self.seen else round((now or time.monotonic()) - self.seen[-1][0], 1)}
