"""Rendering of a doctor report: plain text, rich terminal, HTML page."""

import html
import json
import re

from ._doctor import DTYPES, OUTCOMES, _SEVERITY

DTYPE_WORDS = sorted(DTYPES, key=len, reverse=True)

SYMBOL = {"zero-copy": "✓", "copied": "~", "refused": "✗", "wrong": "!",
          "crashed": "☠", "hung": "⧗", None: "·"}
STYLE = {"zero-copy": "green", "copied": "yellow", "refused": "bright_black",
         "wrong": "bold red", "crashed": "bold magenta", "hung": "bold magenta",
         None: "dim"}
COLOR = {"zero-copy": "#2e9e44", "copied": "#e0b000", "refused": "#9aa0a6",
         "wrong": "#d93025", "crashed": "#8e24aa", "hung": "#6a1b9a",
         None: "#f1f3f4"}
LEGEND = ("✓ zero-copy  ~ copied  ✗ refused  ! wrong data  ☠ crashed  ⧗ hung;  "
          "N/M: zero-copy / run")
SHORT = {"tensorflow": "tf", "dlbridge": "dlbridge", "tvm_ffi": "tvm-ffi"}


def summarize(cells, producer, consumer, path):
    mine = [c for c in cells if c["producer"] == producer
            and c["consumer"] == consumer and c["path"] == path
            and c["outcome"] in _SEVERITY]
    if not mine:
        return None, ""
    worst = max((c["outcome"] for c in mine), key=_SEVERITY.get)
    zc = sum(c["outcome"] == "zero-copy" for c in mine)
    return worst, f"{SYMBOL[worst]} {zc}/{len(mine)}"


def _grid_rows(report, path):
    rows = []
    for p in report["producers"]:
        rows.append((p, [summarize(report["cells"], p, c, path)
                         for c in report["consumers"]]))
    return rows


TITLES = {"own": "own: the consumer's importer, e.g. torch.from_dlpack(x)",
          "dlb": "dlb: dlbridge.convert(x, consumer)"}


def failures(report):
    """Lines describing every non-zero-copy outcome, grouped."""
    groups = {}
    for c in report["cells"]:
        if c["outcome"] in ("zero-copy", "n/a"):
            continue
        reason = c.get("known_limitation")
        msg = re.sub(r"\b(" + "|".join(DTYPE_WORDS) + r")\b", "<dtype>",
                     c.get("message", ""))
        msg = re.sub(r"shape \([0-9, ]*\)", "shape (…)", msg)
        key = (c["outcome"], c["path"], c["consumer"], reason or msg)
        groups.setdefault(key, []).append(c)  # shown with the first message
    out = []
    for (outcome, path, consumer, _), cs in sorted(
            groups.items(), key=lambda kv: (-_SEVERITY[kv[0][0]], kv[0][1], kv[0][2])):
        producers = sorted({c["producer"] for c in cs})
        what = sorted({c["dtype"] if c["layout"] == "contiguous" else c["layout"]
                       for c in cs})
        why = cs[0].get("known_limitation") or cs[0].get("message", "")
        tag = "known upstream limitation: " if cs[0].get("known_limitation") else ""
        out.append({"outcome": outcome, "path": path, "consumer": consumer,
                    "producers": producers, "cases": what,
                    "text": f"{tag}{why}", "count": len(cs)})
    return out


def plain(report, width=100):
    lines = []
    cw = max(9, min(12, (width - 11) // max(1, len(report["consumers"]))))
    for path in ("own", "dlb"):
        lines.append(TITLES[path])
        lines.append("producer ↓ " + "".join(
            SHORT.get(c, c)[:cw - 1].ljust(cw) for c in report["consumers"]))
        for p, row in _grid_rows(report, path):
            lines.append(SHORT.get(p, p)[:10].ljust(11) + "".join(
                (txt or "·").ljust(cw) for _, txt in row))
        lines.append("")
    lines.append(LEGEND)
    return "\n".join(lines)


def failure_text(report, limit=40):
    fl = failures(report)
    lines = [f"{len(fl)} kinds of non-zero-copy outcome:"]
    for f in fl[:limit]:
        lines.append(f"  {SYMBOL[f['outcome']]} [{f['path']}] → {f['consumer']} "
                     f"from {','.join(f['producers'])} ({', '.join(f['cases'][:6])}"
                     f"{'…' if len(f['cases']) > 6 else ''}): {f['text'][:160]}")
    if len(fl) > limit:
        lines.append(f"  … {len(fl) - limit} more in --json / --html")
    return "\n".join(lines)


def rich_grid(report, console):
    from rich.table import Table
    for path in ("own", "dlb"):
        console.print(f"[bold]{TITLES[path]}[/]")
        t = Table(padding=(0, 1), show_edge=False)
        t.add_column("producer ↓", style="bold")
        for c in report["consumers"]:
            t.add_column(SHORT.get(c, c), no_wrap=True)
        for p, row in _grid_rows(report, path):
            t.add_row(SHORT.get(p, p), *[
                f"[{STYLE[w]}]{txt or '·'}[/]" for w, txt in row])
        console.print(t)
        console.print()
    console.print(f"[dim]{LEGEND}[/]")


_CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#202124}
h1{font-size:20px;margin:0 0 4px} .meta{color:#5f6368;font-size:13px}
table.grid{border-collapse:collapse;margin:12px 0 24px}
.grid th{font-size:13px;padding:4px 8px;text-align:center}
.grid td{width:92px;height:34px;text-align:center;font:600 13px monospace;
 color:#fff;border:2px solid #fff;border-radius:4px;cursor:default}
.grid td.empty{background:#f1f3f4;color:#9aa0a6}
.filters{margin:8px 0;font-size:13px} .filters label{margin-right:10px}
.tip{position:fixed;pointer-events:none;background:#202124;color:#fff;
 font-size:12px;padding:6px 8px;border-radius:4px;max-width:520px;display:none;
 white-space:pre-wrap}
.legend span{display:inline-block;padding:2px 8px;margin-right:6px;color:#fff;
 border-radius:3px;font-size:12px}
"""

_JS = """
const R = JSON.parse(document.getElementById('data').textContent);
const SEV = {"zero-copy":0,"copied":1,"refused":2,"wrong":3,"crashed":4,"hung":4};
const COL = %s, SYM = %s;
function on(cls){return [...document.querySelectorAll('.f-'+cls+':checked')].map(e=>e.value);}
function draw(){
  const outs=on('outcome'), dts=on('dtype'), lays=on('layout');
  for (const path of ['own','dlb']){
    for (const td of document.querySelectorAll('td[data-path="'+path+'"]')){
      const cs=R.cells.filter(c=>c.path===path&&c.producer===td.dataset.p&&
        c.consumer===td.dataset.c&&c.outcome in SEV&&dts.includes(c.dtype)&&lays.includes(c.layout));
      const shown=cs.filter(c=>outs.includes(c.outcome));
      if(!shown.length){td.className='empty';td.style.background='';td.textContent='·';td.title='';continue;}
      let w=shown.reduce((a,c)=>SEV[c.outcome]>SEV[a]?c.outcome:a,'zero-copy');
      td.className='cell';td.style.background=COL[w];
      const zc=cs.filter(c=>c.outcome==='zero-copy').length;
      td.textContent=SYM[w]+' '+zc+'/'+cs.length;
      const bad=shown.filter(c=>c.outcome!=='zero-copy');
      td.title=td.dataset.p+' → '+td.dataset.c+' ('+path+')\\n'+(bad.length?bad.map(c=>
        c.outcome+' '+c.dtype+'/'+c.layout+': '+(c.known_limitation?'[upstream] '+c.known_limitation:(c.message||''))).join('\\n'):'all zero-copy');
    }
  }
}
const tip=document.querySelector('.tip');
document.addEventListener('mousemove',e=>{const t=e.target.closest('td.cell');
  if(!t){tip.style.display='none';return;} tip.textContent=t.title;tip.style.display='block';
  tip.style.left=Math.min(e.clientX+12,innerWidth-540)+'px';tip.style.top=(e.clientY+12)+'px';});
document.querySelectorAll('input').forEach(i=>i.addEventListener('change',draw));
draw();
"""


def html_page(report):
    cases = report["cases"]
    dtypes = sorted({c["dtype"] for c in cases}, key=[c["dtype"] for c in cases].index)
    layouts = sorted({c["layout"] for c in cases}, key=[c["layout"] for c in cases].index)

    def boxes(kind, values):
        return "".join(f'<label><input type="checkbox" class="f-{kind}" value="{html.escape(v)}" checked>'
                       f'{html.escape(v)}</label>' for v in values)

    grids = []
    for path in ("own", "dlb"):
        head = "".join(f"<th>{html.escape(c)}</th>" for c in report["consumers"])
        body = "".join(
            f"<tr><th>{html.escape(p)}</th>" + "".join(
                f'<td data-path="{path}" data-p="{html.escape(p)}" data-c="{html.escape(c)}"></td>'
                for c in report["consumers"]) + "</tr>" for p in report["producers"])
        grids.append(f"<h2>{html.escape(TITLES[path])}</h2><table class='grid' id='grid-{path}'>"
                     f"<tr><th>producer ↓ consumer →</th>{head}</tr>{body}</table>")
    legend = "".join(f'<span style="background:{COLOR[o]}">{SYMBOL[o]} {o}</span>' for o in OUTCOMES)
    vers = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    data = json.dumps(report).replace("</", "<\\/")
    fl = "".join(f"<li><b>{SYMBOL[f['outcome']]} {f['outcome']}</b> [{f['path']}] → {html.escape(f['consumer'])} "
                 f"from {html.escape(', '.join(f['producers']))} ({html.escape(', '.join(f['cases']))}): "
                 f"{html.escape(f['text'])}</li>" for f in failures(report))
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>dlbridge doctor</title>
<style>{_CSS}</style></head><body>
<h1>dlbridge doctor</h1><div class="meta">{html.escape(vers)} · Python {report['python']} ·
{len(report['cells'])} probes in {report['seconds']} s · {len(report['defects'])} dlbridge defects</div>
<div class="legend">{legend}</div>
<div class="filters">outcome: {boxes('outcome', OUTCOMES)}</div>
<div class="filters">dtype: {boxes('dtype', dtypes)}</div>
<div class="filters">layout: {boxes('layout', layouts)}</div>
{''.join(grids)}
<h2>Failures and limitations</h2><ul>{fl}</ul>
<div class="tip"></div>
<script type="application/json" id="data">{data}</script>
<script>{_JS % (json.dumps({k: v for k, v in COLOR.items() if k}), json.dumps({k: v for k, v in SYMBOL.items() if k}))}</script>
</body></html>
"""
