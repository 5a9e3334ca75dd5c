// The words the status page writes, by the CLI's and STATUS='s own rules: esc() is genready/redact.py's
// escape(), duration() and ago() are genready/timewords.py's. tests/test_htmlpage.py runs these functions
// in node against the Python ones on the same inputs, ties and edges included. The page's script is this
// file followed by status.js, in one <script>.
"use strict";

// Every control character (C0 but tab, DEL, C1), U+2028/U+2029 and the bidirectional marks as \x1b / \u2028.
const CTRL = /[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;
const hex = (n, w) => n.toString(16).padStart(w, "0");
const esc = (s) => String(s).replace(CTRL, (c) => {
  const n = c.charCodeAt(0);
  return n < 0x100 ? "\\x" + hex(n, 2) : "\\u" + hex(n, 4);
});

// Python's round(): the nearest integer, a tie to the even one (Math.round takes a tie up).
function roundEven(s) {
  let r = Math.round(s);
  if (r - s === 0.5 && r % 2 !== 0) r -= 1;
  return r;
}

// Python's format(x, ".1f") for x >= 0. toFixed rounds the exact binary value as Python does, but takes a
// tie (x an odd multiple of 1/4, such as 0.25: the only tenths a double holds exactly) up, not to even.
function tenths(x) {
  const q = x * 4;
  if (Number.isInteger(q) && q % 2 === 1) {
    const n = Math.floor(x * 10);
    return ((n % 2 === 0 ? n : n + 1) / 10).toFixed(1);
  }
  return x.toFixed(1);
}

// Python's x // y for floats x >= 0, y > 0, as CPython computes it (float_floor_div).
function floorDiv(x, y) {
  const div = (x - x % y) / y;
  const f = Math.floor(div);
  return div - f > 0.5 ? f + 1 : f;
}

const two = (n) => String(n).padStart(2, "0");

// Seconds as people read them: 4.2s, 42s, 3m10s, 6m02s, 1h05m ("?" if unknown).
function duration(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return "?";
  if (s < 10) return tenths(Math.max(0, s)) + "s";
  s = roundEven(s);
  if (s >= 3600) return Math.floor(s / 3600) + "h" + two(Math.floor((s % 3600) / 60)) + "m";
  return s >= 60 ? Math.floor(s / 60) + "m" + two(s % 60) + "s" : s + "s";
}

// "12s ago", "3m ago", "2h ago", "4d ago", for `d` seconds ago.
function ago(d) {
  if (!Number.isFinite(d)) return "";
  d = Math.max(0, d);
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60]]) {
    if (d >= size) return floorDiv(d, size) + unit + " ago";
  }
  return Math.trunc(d) + "s ago";
}
