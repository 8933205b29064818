/* chatsite chat page: the branch tree on screen. "‹ 2/3 ›" switches to a sibling branch without a reload
 * (the server remembers it: conversations/branches.py), older messages load when the top is reached, and a
 * tab re-reads the active branch when another tab changed it. Exposes window.Chat.branches. */
(() => {
  'use strict';
  const Chat = (window.Chat = window.Chat || {});
  const { $ } = Chat;

  function init({ list, urls, csrf, conversationId, busy, onReplaced }) {
    const url = (key) => Chat.sidebar.withId(urls[key], conversationId());

    async function fetchHtml(href, options = {}) {
      const resp = await fetch(href, { credentials: 'same-origin', ...options });
      if (!resp.ok) throw new Error(`The server answered ${resp.status}.`);
      return { html: await resp.text(), hasOlder: resp.headers.get('X-Has-Older') === '1' };
    }

    function olderButton(hasOlder) {
      let row = $('.load-older-row', list);
      if (!hasOlder) { row?.remove(); return; }
      if (!row) {
        list.insertAdjacentHTML('afterbegin',
          '<div class="load-older-row"><button type="button" id="load-older" class="button small">Load older messages</button></div>');
        row = $('.load-older-row', list);
        observer?.observe(row);
      }
    }

    const CONTROLS = ['branch-prev', 'branch-next', 'copy-message', 'edit-message', 'regenerate-button', 'continue-button'];

    /** Where keyboard focus is in the list: {id, control} (or null), to put it back after a re-render. */
    function focusedControl() {
      const el = document.activeElement;
      const msg = el && list.contains(el) ? el.closest('.message') : null;
      if (!msg) return null;
      return { id: msg.dataset.messageId, control: CONTROLS.find((c) => el.classList.contains(c)) };
    }

    function restoreFocus(where) {
      if (!where || list.contains(document.activeElement)) return;
      const msg = list.querySelector(`.message[data-message-id="${Number(where.id)}"]`);
      const target = (msg && where.control && msg.querySelector(`.${where.control}:not([disabled])`))
        || msg?.querySelector('.message-tools button:not([disabled])');
      (target || list).focus();
    }

    function replace({ html, hasOlder }) {
      // A re-render (another tab's change, this tab's own branch switch echoed back) must not drop keyboard
      // focus to the top of the page.
      const where = focusedControl();
      list.innerHTML = html;
      Chat.render.hydrate(list);
      olderButton(hasOlder);
      onReplaced();
      restoreFocus(where);
    }

    let stale = false; // a re-read was skipped while a request ran: re-read once it is done

    /** Re-read the newest page of the active branch (after another tab changed it, after a new branch). */
    async function reload() {
      if (!conversationId()) return;
      const page = await fetchHtml(url('messages'));
      // A message sent meanwhile is not in this page yet: replacing the list would drop its bubbles.
      if (busy()) { stale = true; return; }
      stale = false;
      replace(page);
    }

    async function switchTo(messageId) {
      if (busy()) { Chat.showBanner('Wait for the reply to finish (or stop it) before switching versions.'); return; }
      const body = new FormData();
      body.append('message_id', messageId);
      const focusIdx = [...list.querySelectorAll('.message')].findIndex((m) => m.contains(document.activeElement));
      replace(await fetchHtml(url('branch'), { method: 'POST', body, headers: { 'X-CSRFToken': csrf() } }));
      // Keep keyboard focus on the same switcher after the list was re-rendered.
      const target = list.querySelector(`.message[data-message-id="${messageId}"] .branch-nav button:not([disabled])`);
      if (focusIdx >= 0 && target) target.focus();
    }

    let loading = false;
    async function loadOlder() {
      const first = $('.message[data-message-id]', list);
      if (loading || !first) return;
      loading = true;
      try {
        const page = await fetchHtml(`${url('messages')}?before=${first.dataset.messageId}`);
        const tpl = document.createElement('template');
        tpl.innerHTML = page.html;
        Chat.render.hydrate(tpl.content);
        const before = list.scrollHeight;
        first.before(tpl.content);
        list.scrollTop += list.scrollHeight - before; // keep what was on screen in place
        olderButton(page.hasOlder);
      } finally {
        loading = false;
      }
    }

    list.addEventListener('click', (e) => {
      const nav = e.target.closest('.branch-nav button');
      if (nav) {
        const msg = nav.closest('.message');
        const ids = (msg.dataset.siblingIds || '').split(',').filter(Boolean);
        const at = ids.indexOf(msg.dataset.messageId);
        const next = ids[at + (nav.classList.contains('branch-prev') ? -1 : 1)];
        if (next) switchTo(next).catch((err) => Chat.showBanner(err.message));
      } else if (e.target.closest('#load-older')) {
        loadOlder().catch((err) => Chat.showBanner(err.message));
      }
    });
    const observer = 'IntersectionObserver' in window
      ? new IntersectionObserver((entries) => {
        if (entries.some((en) => en.isIntersecting)) loadOlder().catch(() => {});
      }, { root: list, rootMargin: '200px 0px 0px 0px' })
      : null;
    const row = $('.load-older-row', list);
    // Observe only after the first scroll to the bottom, so opening a chat does not page everything in.
    if (row && observer) setTimeout(() => observer.observe(row), 300);

    return { reload, switchTo, loadOlder, isStale: () => stale, markStale: () => { stale = true; } };
  }

  Chat.branches = { init };
})();
