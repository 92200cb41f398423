// minipar demo, the four modes as a WAI-ARIA tablist (arrow keys, Home and End move between
// the tabs and show their panel; the address's #data, #state, ... opens one), then the
// page's start-up and window.minipar.
var MODES = ["architecture", "data", "state", "performance"];
var MODE = {current: "architecture", resize: null};

// draw the current mode's picture of the drawn scenario (the architecture mode draws itself)
function drawMode() {
  var sc = SC.scenario;
  if (MODE.current === "architecture" || !sc) return;
  if (MODE.current === "data") drawData(sc);
  else if (MODE.current === "state") drawState(sc);
  else drawPerformance(sc);
}

function setMode(mode, focus) {
  MODE.current = mode;
  MODES.forEach(function (m) {
    var tab = $("tab-" + m), on = m === mode;
    tab.setAttribute("aria-selected", on ? "true" : "false");
    tab.tabIndex = on ? 0 : -1;
    $("panel-" + m).hidden = !on;
  });
  if (focus) $("tab-" + mode).focus();
  if (location.hash.slice(1) !== mode && history.replaceState) {
    try { history.replaceState(null, "", "#" + mode); } catch (e) { /* an odd scheme */ }
  }
  if (mode !== "data") stopPlaying();
  if (mode !== "architecture") {  // the scenario's controls and numbers go with the panel
    var panel = $("panel-" + mode);
    panel.insertBefore($("scenario"), panel.firstChild);
    drawMode();
  }
}

function setUpTabs() {
  MODES.forEach(function (m, i) {
    var tab = $("tab-" + m);
    tab.addEventListener("click", function () { setMode(m, false); });
    tab.addEventListener("keydown", function (e) {
      var to = {ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: MODES.length - 1}[e.key];
      if (to === undefined) return;
      e.preventDefault();
      setMode(MODES[(to + MODES.length) % MODES.length], true);
    });
  });
  window.addEventListener("hashchange", modeFromAddress);
  var width = document.body.clientWidth;  // the drawings are drawn to the page's width
  function resized() {
    if (document.body.clientWidth === width) return;
    width = document.body.clientWidth;
    clearTimeout(MODE.resize);
    MODE.resize = setTimeout(drawMode, 150);
  }
  if (window.ResizeObserver) new ResizeObserver(resized).observe(document.body);
  else window.addEventListener("resize", resized);
  Array.prototype.forEach.call(document.querySelectorAll("#modes .kitchen"), function (e) {
    var caption = DATA.captions[e.dataset.k];  // the kitchen beside the precise terms
    e.textContent = caption.split(":")[0];
    e.title = caption;
  });
}

// the mode the address names (demo.html#state), if any
function modeFromAddress() {
  var m = location.hash.slice(1);
  if (MODES.indexOf(m) >= 0 && m !== MODE.current) setMode(m, false);
}

setUpArchitecture();
checkEmbedded();
drawLayout(DATA.layouts[0], "python");
setUpScenario();
setUpData();
setUpState();
setUpTabs();
modeFromAddress();
window.minipar = {computeLayout: computeLayout, layouts: DATA.layouts,
                  current: function () { return arch.layout; },
                  source: function () { return arch.source; }, select: selectGpu,
                  scenario: function () { return SC.scenario; },
                  mode: function () { return MODE.current; }};
