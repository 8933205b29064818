/* Light/dark theme: follows the system setting until the person picks one with the toggle (kept in
 * localStorage). Loaded in <head> so the stored choice applies before the first paint. */
(() => {
  'use strict';
  const KEY = 'chatsite-theme';
  const root = document.documentElement;
  const media = window.matchMedia('(prefers-color-scheme: dark)');
  const stored = () => { try { return localStorage.getItem(KEY); } catch { return null; } };
  const effective = () => stored() || (media.matches ? 'dark' : 'light');

  function apply() {
    const choice = stored();
    if (choice) root.dataset.theme = choice; else delete root.dataset.theme;
    const dark = effective() === 'dark';
    // Code highlighting follows the page theme: highlight.js's light and dark stylesheets.
    for (const link of document.querySelectorAll('link[data-hljs-theme]')) {
      link.media = (link.dataset.hljsTheme === 'dark') === dark ? 'all' : 'not all';
    }
    const btn = document.getElementById('theme-toggle');
    if (btn) {
      btn.setAttribute('aria-pressed', String(dark));
      btn.querySelector('.theme-toggle-label').textContent = 'Dark theme';
    }
  }
  apply();
  media.addEventListener('change', apply);
  document.addEventListener('DOMContentLoaded', () => {
    apply();
    const btn = document.getElementById('theme-toggle');
    if (!btn) return;
    btn.hidden = false;
    btn.addEventListener('click', () => {
      const next = effective() === 'dark' ? 'light' : 'dark';
      try { localStorage.setItem(KEY, next); } catch { /* private mode: this page only */ }
      root.dataset.theme = next;
      apply();
    });
  });
})();
