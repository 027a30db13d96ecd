"""The report page's look: its style sheet, its one inline script and the CSP that allows it.

The page stands alone, so it can travel as an e-mail attachment or a ticket file: the CSS
is inline, nothing is loaded from anywhere, and the Content-Security-Policy forbids every
request and every script but :data:`SCRIPT` (allowed by its hash), which adds "expand
all" / "collapse all" buttons and opens every section before printing. The explorer
serves the same style sheet and sends the same policy.
"""

from __future__ import annotations

import base64
import hashlib

__all__ = ["CSS", "CSP", "SCRIPT"]


#: The page's one script: "expand all" / "collapse all", and every section open to print.
SCRIPT = (
    'document.documentElement.classList.add("js");'
    "function setAll(o){document.querySelectorAll(\"details\").forEach(function(d){d.open=o;});}"
    'document.getElementById("expand-all").onclick=function(){setAll(true);};'
    'document.getElementById("collapse-all").onclick=function(){setAll(false);};'
    'addEventListener("beforeprint",function(){setAll(true);});'
)
_SCRIPT_HASH = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
#: The report page's Content-Security-Policy (the explorer sends it with a report it serves).
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
    f"script-src 'sha256-{_SCRIPT_HASH}'; base-uri 'none'; form-action 'none'"
)


#: The report's style sheet (the explorer serves it as a file).
CSS = """
:root{--fg:#1d232b;--muted:#5d6875;--line:#d9dee4;--bg:#f6f7f9;--card:#fff;--accent:#2457c5;
--ok:#1f7a3f;--okbg:#e5f4ea;--bad:#b42318;--badbg:#fdecea;--warn:#8a5a00;--warnbg:#fff4d6;
--user:#eef3fd;--mono:ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace}
*{box-sizing:border-box}
html{-webkit-text-size-adjust:100%}
body{margin:0;background:var(--bg);color:var(--fg);font:15px/1.5 system-ui,-apple-system,"Segoe UI",
Roboto,"Helvetica Neue",Arial,"DejaVu Sans",sans-serif}
main{max-width:62rem;margin:0 auto;padding:1.5rem 1.25rem 4rem}
h1{font-size:1.45rem;margin:0 0 .25rem;overflow-wrap:anywhere}
h2{font-size:1.1rem;margin:2rem 0 .6rem}
code,pre,.mono{font-family:var(--mono);font-size:.86em}
pre{margin:0;white-space:pre-wrap;overflow-wrap:anywhere;background:#f3f5f8;border:1px solid var(--line);
border-radius:6px;padding:.5rem .65rem;max-height:32rem;overflow:auto}
.sub{color:var(--muted);margin:0 0 1rem}
.top{display:grid;grid-template-columns:minmax(0,3fr) minmax(0,2fr);gap:1rem;align-items:start}
.top h2{margin:0 0 .5rem;font-size:1rem}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:1rem 1.15rem}
.facts{display:grid;grid-template-columns:max-content 1fr;gap:.3rem 1.2rem;margin:0}
.facts dt{color:var(--muted)}.facts dd{margin:0;overflow-wrap:anywhere}
.badge{display:inline-block;border-radius:999px;padding:0 .55rem;font-size:.78rem;font-weight:600;
line-height:1.55rem;border:1px solid transparent;white-space:nowrap;vertical-align:middle}
.b-ok,.b-idle,.b-done{background:var(--okbg);color:var(--ok)}
.b-bad,.b-error,.b-interrupted{background:var(--badbg);color:var(--bad);border-color:#f5c2bd}
.b-stopped,.b-cancelled,.b-retry,.b-awaiting-confirmation,.b-partial{background:var(--warnbg);color:var(--warn)}
.b-streaming,.b-running,.b-info{background:#e8effc;color:var(--accent)}
.controls{display:none;gap:.5rem;margin:.5rem 0 0}.js .controls{display:flex}
button{font:inherit;font-size:.85rem;border:1px solid var(--line);background:var(--card);border-radius:6px;
padding:.2rem .7rem;cursor:pointer}
ul.tree{list-style:none;margin:.2rem 0;padding-left:1.1rem;border-left:2px solid var(--line)}
ul.tree.root{border:0;padding-left:0}
ul.tree li{margin:.15rem 0}.here{font-weight:700}
details.turn{background:var(--card);border:1px solid var(--line);border-left:5px solid var(--ok);
border-radius:10px;margin:.75rem 0}
details.turn.o-error{border-left-color:var(--bad)}
details.turn.o-stopped{border-left-color:#d89b00}
details.turn.o-streaming{border-left-color:var(--accent)}
details.turn>summary{cursor:pointer;padding:.6rem .9rem;display:flex;flex-wrap:wrap;gap:.35rem .6rem;
align-items:baseline;list-style-position:outside}
details.turn>summary .tno{font-weight:700}
details.turn>summary .preview{flex:1 1 16rem;min-width:0;overflow:hidden;text-overflow:ellipsis;
white-space:nowrap}
details.turn>summary .vers{color:var(--muted);font-size:.85rem}
.turn-body{padding:0 1rem 1rem}
.meta{color:var(--muted);font-size:.88rem;margin:.1rem 0 .8rem;overflow-wrap:anywhere}
.msg{margin:.6rem 0;padding:.55rem .8rem;border-radius:8px;border:1px solid var(--line)}
.msg.user{background:var(--user);border-color:#cfdcf7}
.msg.assistant{background:var(--card)}
.role{font-size:.75rem;font-weight:700;letter-spacing:.04em;text-transform:uppercase;color:var(--muted)}
.role .mono{text-transform:none;letter-spacing:0;font-weight:400}
.text{white-space:pre-wrap;overflow-wrap:anywhere;margin:.2rem 0}
details.reasoning{margin:.3rem 0;color:var(--muted)}
details.reasoning>summary,details.fold>summary,details.attempt>summary{cursor:pointer;font-size:.85rem}
details.reasoning .text{font-style:italic}
.tool{margin:.45rem 0;border:1px solid var(--line);border-radius:8px;padding:.45rem .7rem;background:#fbfcfd;
break-inside:avoid}
.tool.s-error{border-color:#f0b7b1;background:#fffafa}
.tool.s-cancelled{border-color:#ecd28f}
.tool-head{display:flex;flex-wrap:wrap;gap:.3rem .6rem;align-items:baseline}
.tname{font-weight:700;font-family:var(--mono);font-size:.92em;overflow-wrap:anywhere}
.muted{color:var(--muted)}
.io{display:grid;grid-template-columns:4.2rem 1fr;gap:.3rem .5rem;margin-top:.35rem;align-items:start}
.io>.label{color:var(--muted);font-size:.8rem;padding-top:.45rem}
.agent{margin:.5rem 0 .2rem .4rem;padding-left:.9rem;border-left:3px solid #c9d6f2}
.agent>.role{color:var(--accent)}
.prompt{margin:.3rem 0;font-size:.9rem}
.alert{border-radius:8px;padding:.5rem .75rem;margin:.6rem 0;background:var(--badbg);color:var(--bad);
border:1px solid #f5c2bd;overflow-wrap:anywhere}
.alert.warn{background:var(--warnbg);color:var(--warn);border-color:#ecd28f}
ol.timeline{margin:.4rem 0 0;padding-left:1.2rem;font-size:.88rem}
ol.timeline li{margin:.1rem 0;overflow-wrap:anywhere}
details.attempt{margin:.5rem 0;border:1px dashed var(--line);border-radius:8px;padding:.3rem .7rem}
table{border-collapse:collapse;width:100%;font-size:.86rem}
th,td{text-align:left;padding:.25rem .5rem;border-bottom:1px solid var(--line);vertical-align:top;
overflow-wrap:anywhere}
th{color:var(--muted);font-weight:600}
.diff-add{border-left:4px solid var(--ok)}.diff-del{border-left:4px solid var(--bad)}
.diff-chg{border-left:4px solid #d89b00}
.empty{color:var(--muted);font-style:italic}
footer{margin-top:2.5rem;color:var(--muted);font-size:.8rem}
@media (max-width:52rem){.top{grid-template-columns:1fr}}
@media (max-width:40rem){.facts{grid-template-columns:1fr}.io{grid-template-columns:1fr}}
@media print{details::details-content{content-visibility:visible;display:contents}
details>summary::marker{content:""}body{background:#fff;font-size:11pt}main{max-width:none;padding:0}.controls{display:none!important}
.card,details.turn,.msg,.tool{border-color:#999}pre{max-height:none;overflow:visible;background:#fff}
details.turn>summary .preview{white-space:normal}a{color:inherit}h2{break-after:avoid}}
"""
