"""Rendering of a judged doctor report (``_doctor.judge``): plain text, a
rich terminal, a self-contained HTML page.  Nothing here probes or judges.

A grid cell sums up the probes of one producer -> consumer pair on one
path: ``good/n``, the correct results (zero-copy or a correct copy) out of
the probes the producer can make; its colour is that share, from grey
(none) to green (all); ``*`` marks a dlbridge gap among them and ``!`` a
wrong value, a writable alias of read-only memory, a crash or a hang.
"""

import html
import json
import re

from ._doctor import BAD, GOOD, NA, OUTCOMES
from ._kits import short_name

SYMBOL = {"zero-copy": "✓", "copied": "~", "refused": "✗", "error": "✗",
          "wrong": "!", "writable-alias": "!", "crashed": "☠", "hung": "⧗",
          NA: "·"}
SECTION = {"gap": "dlbridge gaps", "upstream": "upstream limitations",
           "decision": "deliberate dlbridge decisions",
           NA: "probes a producer cannot make (n/a)"}
LABEL_ORDER = ("gap", "decision", "upstream", NA)
TITLES = {"own": "own: the consumer's importer, e.g. torch.from_dlpack(x)",
          "dlb": "dlb: dlbridge.convert(x, consumer)"}
LEGEND = ("N/M: correct results (zero-copy or copy) of the M probes the "
          "producer can make;  * a dlbridge gap;  ! wrong data, a writable "
          "alias of read-only memory, a crash or a hang")
# The colour of a cell: its share of good outcomes, grey (none) through
# pale green (almost all) to a full green kept for all of them, so that
# 15/16 does not pass for 16/16.
_GREY, _PALE, _GREEN = (0xbd, 0xc1, 0xc6), (0x8c, 0xc7, 0x98), (0x2e, 0x9e, 0x44)


def _name(fw):
    return short_name(fw)


def stats(cells, producer, consumer, path):
    """The numbers of one grid cell (None when nothing was probed)."""
    mine = [c for c in cells if c["producer"] == producer
            and c["consumer"] == consumer and c["path"] == path]
    if not mine:
        return None
    run = [c for c in mine if c["outcome"] != NA]
    return {"n": len(run), "na": len(mine) - len(run),
            "good": sum(c["outcome"] in GOOD for c in run),
            "zero_copy": sum(c["outcome"] == "zero-copy" for c in run),
            "bad": sum(c["outcome"] in BAD for c in run),
            "gaps": sum(c.get("label") == "gap" for c in run)}


def cell_text(st):
    if st is None or st["n"] == 0:
        return "·"
    mark = "!" if st["bad"] else "*" if st["gaps"] else ""
    return f"{st['good']}/{st['n']}{mark}"


def share(st):
    return st["good"] / st["n"] if st and st["n"] else None


def colour(fraction):
    """#rrggbb of a share of good outcomes."""
    if fraction is None:
        return "#f1f3f4"
    rgb = _GREEN if fraction >= 1 else (
        round(g + (e - g) * fraction) for g, e in zip(_GREY, _PALE))
    return "#" + "".join(f"{v:02x}" for v in rgb)


def _rich_style(st):
    f = share(st)
    if f is None:
        return "dim"
    base = ("green" if f == 1 else "green3" if f >= 0.75 else
            "yellow" if f >= 0.5 else "dark_orange" if f > 0 else "bright_black")
    return ("bold red" if st["bad"] else f"bold {base}" if st["gaps"] else base)


# ------------------------------------------------------------------ headline

def headline(report):
    """The summary a person reads first, as lines of text."""
    s = report["summary"]

    def counts(path):
        t = s[path]
        return (t["zero-copy"], t["copied"], t["refused"] + t["error"],
                sum(t[o] for o in BAD))
    rows = [("dlbridge.convert", counts("dlb")), ("own importer", counts("own"))]
    n, na = s["dlb"]["probes"], s["dlb"]["n/a"]
    lines = [f"{n:,} producer → consumer probes ({na:,} more the producer "
             "cannot make: n/a), each through both paths:",
             f"{'':<18}{'zero-copy':>10}{'copy':>8}{'refused':>9}{'bad':>6}"]
    for name, (zc, cp, rf, bad) in rows:
        lines.append(f"{name:<18}{zc:>10,}{cp:>8,}{rf:>9,}{bad:>6,}")
    lines.append(f"convert worse than the own importer: {s['worse_than_native']:,} "
                 f"(target 0); better: {s['better_than_native']:,}; worse by "
                 f"deliberate decision: {s['worse_by_decision']:,}")
    lines.append(f"labels: {s['gap']:,} dlbridge gaps"
                 + (" (exit status 1)" if s["gap"] else "")
                 + f", {s['upstream']:,} upstream limitations, "
                 f"{s['decision']:,} dlbridge decisions")
    return lines


# ------------------------------------------------------------------ grids

def _grid(report, path):
    return [(p, [stats(report["cells"], p, c, path) for c in report["consumers"]])
            for p in report["producers"]]


def plain(report, width=100):
    """Headline and the two grids as text no wider than ``width``; grids
    with many consumers are split into blocks of columns."""
    lines = headline(report) + [""]
    cw = 9
    per_block = max(1, (width - 11) // cw)
    consumers = report["consumers"]
    for path in ("own", "dlb"):
        lines.append(TITLES[path])
        rows = _grid(report, path)
        for start in range(0, len(consumers), per_block):
            block = range(start, min(start + per_block, len(consumers)))
            lines.append("producer ↓ " + "".join(
                _name(consumers[i])[:cw - 1].ljust(cw) for i in block).rstrip())
            for p, row in rows:
                lines.append((_name(p)[:10].ljust(11) + "".join(
                    cell_text(row[i]).ljust(cw) for i in block)).rstrip())
        lines.append("")
    lines.append(LEGEND)
    return "\n".join(_fit(line, width) for line in lines)


def _fit(line, width):
    if len(line) <= width:
        return line
    import textwrap
    return "\n".join(textwrap.wrap(line, width, subsequent_indent="  "))


def rich_grid(report, console):
    from rich.table import Table
    for line in headline(report):
        console.print(line, highlight=False)
    console.print()
    for path in ("own", "dlb"):
        console.print(f"[bold]{TITLES[path]}[/]")
        t = Table(padding=(0, 1), show_edge=False)
        t.add_column("producer ↓", style="bold", no_wrap=True)
        for c in report["consumers"]:
            t.add_column(_name(c), no_wrap=True)
        for p, row in _grid(report, path):
            t.add_row(_name(p), *[f"[{_rich_style(st)}]{cell_text(st)}[/]"
                                  for st in row])
        console.print(t)
        console.print()
    console.print(f"[dim]{LEGEND}[/]")


# ------------------------------------------------------------------ reasons

_DTYPES_RE = re.compile(r"\b(bool|u?int\d+|float\d+|complex\d+|bfloat16|"
                        r"float8_\w+)\b")


def failures(report):
    """Every outcome that is not zero-copy, grouped by label, path,
    consumer and reason: [{label, path, consumer, producers, cases,
    outcomes, reason, message, count}], gaps first."""
    groups = {}
    for c in report["cells"]:
        if c.get("label") in (None, "ok"):
            continue
        reason = _DTYPES_RE.sub("<dtype>", c.get("reason") or "")
        reason = re.sub(r"shape \([0-9, ]*\)", "shape (…)", reason)
        # what a producer cannot make is the same for every consumer
        key = ((NA, "-", c["producer"], reason) if c["label"] == NA else
               (c["label"], c["path"], c["consumer"], reason))
        groups.setdefault(key, []).append(c)
    out = []
    for (label, path, who, _), cs in sorted(
            groups.items(), key=lambda kv: (LABEL_ORDER.index(kv[0][0]),
                                            kv[0][1], kv[0][2], -len(kv[1]))):
        out.append({
            "label": label, "path": path,
            "consumer": "-" if label == NA else who,
            "producers": sorted({c["producer"] for c in cs}),
            "cases": sorted({c["dtype"] if c["layout"] == "contiguous"
                             else c["layout"] for c in cs}),
            "outcomes": sorted({c["outcome"] for c in cs}, key=_outcome_order),
            "reason": cs[0].get("reason") or "",
            "message": next((c["message"] for c in cs if c.get("message")), ""),
            "count": len(cs)})
    return out


def _outcome_order(o):
    return OUTCOMES.index(o) if o in OUTCOMES else len(OUTCOMES)


def _failure_line(f, limit=None):
    cases = f["cases"] if limit is None else f["cases"][:6]
    more = "…" if limit is not None and len(f["cases"]) > 6 else ""
    text = f["reason"]
    if f["message"] and f["message"] not in text:
        text += f" — {f['message']}"
    if limit is not None:
        text = text[:limit]
    if f["label"] == NA:
        return (f"{f['producers'][0]} ({', '.join(cases)}{more}; "
                f"{f['count']} probes): {text}")
    return (f"{''.join(SYMBOL[o] for o in f['outcomes'])} [{f['path']}] → "
            f"{f['consumer']} from {','.join(f['producers'])} "
            f"({', '.join(cases)}{more}; {f['count']}): {text}")


def failure_text(report, limit=40):
    fl = [f for f in failures(report) if f["label"] != NA]
    lines = []
    for label in LABEL_ORDER[:-1]:
        mine = [f for f in fl if f["label"] == label]
        if not mine:
            continue
        lines.append(f"{SECTION[label]} ({sum(f['count'] for f in mine)} "
                     f"probes, {len(mine)} kinds):")
        for f in mine[:limit]:
            lines.append("  " + _failure_line(f, 200))
        if len(mine) > limit:
            lines.append(f"  … {len(mine) - limit} more in --json / --html")
    return "\n".join(lines)


# ------------------------------------------------------------------ HTML

_CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#202124}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:18px 0 4px}
.meta{color:#5f6368;font-size:13px}
table.head{border-collapse:collapse;margin:10px 0;font-size:14px}
.head td,.head th{padding:3px 12px;text-align:right}
.head th:first-child,.head td:first-child{text-align:left}
.verdict{font-size:15px;margin:4px 0} .verdict b.bad{color:#d93025}
table.grid{border-collapse:collapse;margin:8px 0 16px}
.grid th{font-size:12px;padding:4px 6px;text-align:center}
.grid td{width:74px;height:30px;text-align:center;font:600 13px monospace;
 color:#fff;border:2px solid #fff;border-radius:4px;cursor:default}
.grid td.empty{background:#f1f3f4;color:#9aa0a6}
.grid td.gap{box-shadow:inset 0 0 0 3px #d93025}
.filters{margin:6px 0;font-size:13px} .filters label{margin-right:10px}
.tip{position:fixed;pointer-events:none;background:#202124;color:#fff;
 font-size:12px;padding:6px 8px;border-radius:4px;max-width:720px;display:none;
 white-space:pre-wrap}
.scale span{display:inline-block;width:46px;padding:2px 0;text-align:center;
 color:#202124;font-size:12px;border-radius:3px;margin-right:2px}
.scale span:last-child{color:#fff}
li{margin:2px 0;font-size:13px}
"""

_JS = """
const R = JSON.parse(document.getElementById('data').textContent);
const GOOD = ['zero-copy','copied'], BAD = %s, GREY = %s, PALE = %s, GREEN = %s;
function on(cls){return [...document.querySelectorAll('.f-'+cls+':checked')].map(e=>e.value);}
function colour(f){const c=f>=1?GREEN:GREY.map((g,i)=>Math.round(g+(PALE[i]-g)*f));return 'rgb('+c.join(',')+')';}
function draw(){
  const outs=on('outcome'), labels=on('label'), dts=on('dtype'), lays=on('layout');
  for (const td of document.querySelectorAll('td[data-path]')){
    const cs=R.cells.filter(c=>c.path===td.dataset.path&&c.producer===td.dataset.p&&
      c.consumer===td.dataset.c&&dts.includes(c.dtype)&&lays.includes(c.layout)&&
      outs.includes(c.outcome)&&labels.includes(c.label));
    const run=cs.filter(c=>c.outcome!=='n/a');
    if(!run.length){td.className='empty';td.style.background='';td.style.color='';td.textContent='·';
      td.title=cs.length?cs.map(c=>'n/a '+c.dtype+'/'+c.layout+': '+c.reason).join('\\n'):'';continue;}
    const good=run.filter(c=>GOOD.includes(c.outcome)).length;
    const bad=run.some(c=>BAD.includes(c.outcome)), gap=run.some(c=>c.label==='gap');
    td.className='cell'+(gap?' gap':''); td.style.background=colour(good/run.length);
    td.style.color=good===run.length?'#fff':'#202124';
    td.textContent=good+'/'+run.length+(bad?'!':gap?'*':'');
    const rest=cs.filter(c=>c.outcome!=='zero-copy');
    td.title=td.dataset.p+' → '+td.dataset.c+' ('+td.dataset.path+'): '+good+' of '+
      run.length+' correct, '+run.filter(c=>c.outcome==='zero-copy').length+' zero-copy\\n'+
      rest.map(c=>c.outcome+' '+c.dtype+'/'+c.layout+' ['+c.label+(c.worse_than_native?
      ', worse than native':'')+'] '+(c.reason||'')+(c.message&&c.message!==c.reason?
      ' — '+c.message:'')).join('\\n');
  }
}
const tip=document.querySelector('.tip');
document.addEventListener('mousemove',e=>{const t=e.target.closest('td[title]');
  if(!t||!t.title){tip.style.display='none';return;} tip.textContent=t.title;tip.style.display='block';
  tip.style.left=Math.min(e.clientX+12,innerWidth-740)+'px';tip.style.top=(e.clientY+12)+'px';});
document.querySelectorAll('input').forEach(i=>i.addEventListener('change',draw));
draw();
"""


def _esc(x):
    return html.escape(str(x))


def _boxes(kind, values):
    return "".join(f'<label><input type="checkbox" class="f-{kind}" '
                   f'value="{_esc(v)}" checked>{_esc(v)}</label>' for v in values)


def _html_headline(report):
    s = report["summary"]
    rows = []
    for name, path in (("dlbridge.convert", "dlb"), ("own importer", "own")):
        t = s[path]
        rows.append(f"<tr><td>{name}</td><td>{t['zero-copy']:,}</td>"
                    f"<td>{t['copied']:,}</td><td>{t['refused'] + t['error']:,}</td>"
                    f"<td>{sum(t[o] for o in BAD):,}</td></tr>")
    worse = s["worse_than_native"]
    return (f"<p class='verdict'>{s['dlb']['probes']:,} producer → consumer "
            f"probes ({s['dlb']['n/a']:,} more the producer cannot make), each "
            "through both paths:</p>"
            "<table class='head'><tr><th></th><th>zero-copy</th><th>copy</th>"
            f"<th>refused</th><th>bad</th></tr>{''.join(rows)}</table>"
            f"<p class='verdict'>convert worse than the own importer: "
            f"<b class='{'bad' if worse else ''}'>{worse:,}</b> (target 0) · "
            f"better: {s['better_than_native']:,} · worse by deliberate "
            f"decision: {s['worse_by_decision']:,}</p>"
            f"<p class='verdict'><b class='{'bad' if s['gap'] else ''}'>"
            f"{s['gap']:,} dlbridge gaps</b> · {s['upstream']:,} upstream "
            f"limitations · {s['decision']:,} dlbridge decisions</p>")


def html_page(report):
    cases = report["cases"]
    dtypes = list(dict.fromkeys(c["dtype"] for c in cases))
    layouts = list(dict.fromkeys(c["layout"] for c in cases))
    grids = []
    for path in ("own", "dlb"):
        head = "".join(f"<th>{_esc(_name(c))}</th>" for c in report["consumers"])
        body = "".join(
            f"<tr><th>{_esc(_name(p))}</th>" + "".join(
                f'<td data-path="{path}" data-p="{_esc(p)}" data-c="{_esc(c)}"></td>'
                for c in report["consumers"]) + "</tr>" for p in report["producers"])
        grids.append(f"<h2>{_esc(TITLES[path])}</h2><table class='grid' id='grid-{path}'>"
                     f"<tr><th>producer ↓ consumer →</th>{head}</tr>{body}</table>")
    scale = "".join(f'<span style="background:{colour(f / 4)}">{25 * f}%</span>'
                    for f in range(5))
    vers = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    data = json.dumps(report).replace("</", "<\\/")
    sections = []
    for label in LABEL_ORDER:
        fl = [f for f in failures(report) if f["label"] == label]
        if fl:
            items = "".join(f"<li>{_esc(_failure_line(f))}</li>" for f in fl)
            sections.append(f"<h2>{_esc(SECTION[label])} "
                            f"({sum(f['count'] for f in fl)} probes)</h2><ul>{items}</ul>")
    js = _JS % (json.dumps(list(BAD)), json.dumps(list(_GREY)),
                json.dumps(list(_PALE)), json.dumps(list(_GREEN)))
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>dlbridge doctor</title>
<style>{_CSS}</style></head><body>
<h1>dlbridge doctor</h1><div class="meta">{_esc(vers)} · Python {_esc(report.get('python', '?'))} ·
{len(report['cells']):,} probes in {report.get('seconds', '?')} s</div>
{_html_headline(report)}
<div class="scale">share of correct results: {scale} · red outline: a dlbridge gap ·
N/M! : wrong data, writable alias of read-only memory, crash or hang · hover a cell for every message</div>
<div class="filters">outcome: {_boxes('outcome', list(OUTCOMES) + [NA])}</div>
<div class="filters">label: {_boxes('label', ['ok', 'gap', 'upstream', 'decision', NA])}</div>
<div class="filters">dtype: {_boxes('dtype', dtypes)}</div>
<div class="filters">layout: {_boxes('layout', layouts)}</div>
{''.join(grids)}
{''.join(sections)}
<div class="tip"></div>
<script type="application/json" id="data">{data}</script>
<script>{js}</script>
</body></html>
"""
