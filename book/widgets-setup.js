// Loaded by every page that has widgets, after require.js and before embed-amd.js
// (see `nb_ipywidgets_js` in _config.yml; book/assets.py copies this file to
// _build/html/_static/widgets/setup.js, next to the files it fetches).
(function () {
  "use strict";
  var script = document.currentScript;
  var here = new URL(".", script.src).href; // .../_static/widgets/

  // 1. Fonts. embed-amd.js (@jupyter-widgets/html-manager) defines its modules with
  // require.js and asks for its font files (Font Awesome, for the icons of Play and Button
  // widgets) relative to each module's URL, which require.js builds from `baseUrl`: by
  // default the folder of the page (chapters/@jupyter-widgets/<hash>.woff2, ...). With
  // `baseUrl` here, they are the copies served with the book, under _static/widgets/.
  window.requirejs.config({ baseUrl: here });

  // 2. No CDN. Widget modules that embed-amd.js does not bundle (third-party widgets) are
  // fetched from the CDN named by a `data-jupyter-widgets-cdn` attribute (jsdelivr by
  // default); look for them here instead (none ship with this book), so that a page never
  // asks another host for anything.
  script.setAttribute("data-jupyter-widgets-cdn", here + "npm/");

  // 3. Icons. The theme's Font Awesome script (pydata-sphinx-theme's fontawesome.js,
  // loaded with `defer`, so after this file) replaces every <i class="fa ..."> with an
  // <svg>, also those that widgets add later, by watching the page. The Play widget
  // then finds no <i> to switch between play and pause and throws "Cannot set
  // properties of undefined (setting 'className')" whenever its value changes, which
  // stops the change from reaching the widgets linked to it (the Stack of a slider).
  // Widgets render after the `load` event, after the theme's icons have been replaced:
  // stop watching, and widget icons stay <i>, drawn with the fonts of embed-amd.js.
  window.FontAwesomeConfig = Object.assign({}, window.FontAwesomeConfig, { observeMutations: false });

  // 4. MathJax 3. The widgets typeset their descriptions with the MathJax 2 call
  // `MathJax.Hub.Queue(["Typeset", MathJax.Hub, element])`, which throws "Cannot read
  // properties of undefined (reading 'Queue')" with the MathJax 3 that Sphinx loads.
  // Widgets render after the `load` event, when MathJax 3 (loaded with `defer`) has
  // replaced its configuration object: give it that one call, done the MathJax 3 way.
  window.addEventListener("load", function () {
    var mj = window.MathJax;
    if (!mj || mj.Hub || !mj.startup || String(mj.version).charAt(0) !== "3") return;
    mj.Hub = {
      Queue: function (command) {
        var element = command && command[2];
        if (!element) return;
        mj.startup.promise = mj.startup.promise
          .then(function () { return mj.typesetPromise([element]); })
          .catch(function (err) { console.error("MathJax could not typeset a widget:", err); });
      },
    };
  });
})();
