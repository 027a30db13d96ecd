// The explorer's only script: the version scrubber, its keyboard, live updates, the
// verify result. Pages read fully without it (forms and links do the same work).
(function () {
  "use strict";
  document.documentElement.classList.add("js");

  var verify = document.getElementById("verify");
  if (verify && verify.dataset.src) {
    fetch(verify.dataset.src, { headers: { Accept: "text/html" } })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        var box = document.createElement("div");
        box.innerHTML = html;  // server-rendered, escaped
        var got = box.querySelector("#verify");
        if (got) { verify.replaceWith(got); }
      })
      .catch(function () { verify.textContent = "verify could not run"; });
  }

  var form = document.querySelector("form.scrub");
  if (!form) { return; }
  var slider = document.getElementById("scrub");
  var shown = document.getElementById("shown");
  var of = document.getElementById("of");
  var head = document.getElementById("head");
  var live = document.getElementById("live");
  var viewUrl = form.dataset.view;
  var loading = null;   // the version being fetched
  var wanted = null;    // the newest version asked for while a fetch runs

  function show(v) {
    v = Math.max(Number(slider.min), Math.min(Number(slider.max), v));
    slider.value = String(v);
    shown.textContent = "v" + v;
    live.checked = v === Number(slider.max);
    history.replaceState(null, "", "?v=" + v);
    fetchView(v);
  }

  function fetchView(v) {
    if (loading !== null) { wanted = v; return; }
    loading = v;
    var view = document.getElementById("view");
    if (view) { view.classList.add("loading"); }
    fetch(viewUrl + "?v=" + v, { headers: { Accept: "text/html" } })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        var box = document.createElement("div");
        box.innerHTML = html;  // server-rendered, escaped
        var fresh = box.querySelector("#view");
        var old = document.getElementById("view");
        if (fresh && old) { old.replaceWith(fresh); }
      })
      .catch(function () {})
      .then(function () {
        loading = null;
        var view = document.getElementById("view");
        if (view) { view.classList.remove("loading"); }
        if (wanted !== null && wanted !== v) { var w = wanted; wanted = null; fetchView(w); }
        wanted = null;
      });
  }

  slider.addEventListener("input", function () { show(Number(slider.value)); });
  document.getElementById("prev").addEventListener("click", function () { show(Number(slider.value) - 1); });
  document.getElementById("next").addEventListener("click", function () { show(Number(slider.value) + 1); });
  document.addEventListener("keydown", function (e) {
    var t = e.target;
    if (t === slider || (t && /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName))) { return; }  // the slider steps itself
    if (e.key === "ArrowLeft") { e.preventDefault(); show(Number(slider.value) - 1); }
    if (e.key === "ArrowRight") { e.preventDefault(); show(Number(slider.value) + 1); }
  });

  if (!window.EventSource) { return; }
  var source = new EventSource(form.dataset.events + "?after=" + slider.max);
  source.onopen = function () { form.dataset.live = "open"; };
  source.onmessage = function (e) {
    var ev = JSON.parse(e.data);
    var v = Number(ev.version);
    if (v <= Number(slider.max)) { return; }
    slider.max = String(v);
    of.textContent = "v" + v;
    if (head) { head.textContent = "v" + v; }
    if (live.checked) { show(v); }
  };
  source.addEventListener("gone", function (e) {
    source.close();
    var note = document.createElement("p");
    note.className = "live-note";
    note.textContent = "Live updates ended: " + JSON.parse(e.data).message + " Reload the page.";
    form.appendChild(note);
  });
})();
