/* chatsite chat page: the conversation controller. Requests (send, edit, regenerate, continue, stop), the
 * reply being generated, busy/rate-limit auto-retry, and the wiring of the page's modules. Plain ES2020, no
 * build step; the other concerns live in view.js (banner, status lines, message list, controls), frames.js
 * (what each server frame does), render.js, socket.js, sidebar.js, composer.js, branches.js. */
(() => {
  'use strict';
  document.documentElement.classList.add('js');
  const app = document.getElementById('chat-app');
  if (!app) return;
  const Chat = window.Chat;
  const { $, $$, FINAL, render } = Chat;

  const els = {
    list: $('#message-list'), stop: $('#stop-button'), send: $('#send-button'), conn: $('#connection-status'),
    queue: $('#queue-status'), queueText: $('#queue-status .queue-text'), queueCancel: $('#queue-status .queue-cancel'),
    banner: $('#chat-banner'), title: $('#conversation-title'), model: $('#model-select'),
  };
  const pageConfig = JSON.parse($('#chat-config')?.textContent || '{}');
  const cfg = {
    wsPath: app.dataset.wsPath || '/ws/chat/',
    maxChars: parseInt(app.dataset.maxChars, 10) || 0,
    detailUrl: app.dataset.detailUrl,
    backoff: pageConfig.backoff || { kind: 'linear', base_s: 5, cap_s: 5 },
  };
  const state = {
    conversationId: app.dataset.conversationId ? Number(app.dataset.conversationId) : null,
    retryTimer: null,
    active: null,  // reply being generated: {id, el, text, lastSeq, resyncing, stopping}
    pending: null, // frame not yet answered by `queued`: {frame, text, userEl, transmitted, stopRequested, attempts}
    unavailableBanner: false, // the banner shows an `unavailable` error: hidden when the socket opens again
  };
  const busy = () => Boolean(state.active || state.pending);
  const csrf = () => $('input[name="csrfmiddlewaretoken"]', app)?.value || '';

  // ---------- The view: banner, status lines, message list, controls (view.js) ----------
  const view = Chat.view.init({ els, state, busy });
  const { showBanner, hideBanner, setQueueStatus, setConn, messageById, lastMessage, addMessage } = view;
  const { scrollToBottom, refreshControls } = view;
  Chat.showBanner = showBanner;

  // ---------- Model choice ----------
  // Only a plan with several models has the picker. Its value rides on send/edit/regenerate ("" = the
  // plan's routing); the server validates it and remembers it on the conversation, so a reload of the
  // conversation shows it again. A new chat keeps an unsent choice in localStorage.
  const MODEL_KEY = 'chatsite.newChatModel';
  const withModel = (frame) => (els.model ? { ...frame, model: els.model.value } : frame);
  if (els.model) {
    const saved = !state.conversationId && localStorage.getItem(MODEL_KEY);
    if (saved && [...els.model.options].some((o) => o.value === saved)) els.model.value = saved;
    els.model.addEventListener('change', () => {
      if (!state.conversationId) localStorage.setItem(MODEL_KEY, els.model.value);
    });
  }

  // ---------- Requests ----------
  function request(frame, extra = {}) {
    hideBanner();
    state.pending = { frame, transmitted: false, stopRequested: false, attempts: 0, ...extra };
    transmit();
    refreshControls();
  }

  function transmit() { // (re)send the pending frame; if the socket is down, `open` sends it
    const p = state.pending;
    if (!p) return;
    p.transmitted = socket.send(p.frame);
    setQueueStatus(p.transmitted ? 'Sending…' : 'Waiting for the connection…', 'sending');
  }

  function newClientId() { // a UUID v4; crypto.randomUUID needs a secure context, getRandomValues does not
    if (crypto.randomUUID) return crypto.randomUUID();
    const b = crypto.getRandomValues(new Uint8Array(16));
    b[6] = (b[6] & 0x0f) | 0x40; b[8] = (b[8] & 0x3f) | 0x80;
    const h = [...b].map((x) => x.toString(16).padStart(2, '0')).join('');
    return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
  }

  function sendText(text, editId = null) {
    if (busy()) return false;
    let userEl = null;
    if (editId) {
      // The edited message and everything after it leave the screen; the new branch replaces them.
      const original = messageById(editId);
      const hidden = original ? [original, ...nextSiblings(original)] : [];
      hidden.forEach((el) => { el.hidden = true; });
      userEl = addMessage('user', null, 'pending');
      $('.content', userEl).textContent = text;
      request(withModel({ type: 'edit', message_id: Number(editId), content: text }),
        { text, userEl, hidden, retry: () => retryText(text, editId) });
    } else {
      userEl = addMessage('user', null, 'pending');
      $('.content', userEl).textContent = text;
      // client_id: the idempotency key, so a resend after a dropped connection never stores it twice.
      request(withModel({ type: 'send', conversation_id: state.conversationId, content: text, client_id: newClientId() }),
        { text, userEl, retry: () => retryText(text) });
    }
    return true;
  }
  function retryText(text, editId = null) { composer.consume(text); sendText(text, editId); }
  const nextSiblings = (el) => { const out = []; for (let n = el.nextElementSibling; n; n = n.nextElementSibling) out.push(n); return out; };

  function regenerate() {
    if (busy() || !state.conversationId) return;
    const last = lastMessage();
    const replaces = last?.classList.contains('assistant') ? last : null;
    if (replaces) replaces.hidden = true; // kept on the server as a sibling: ‹ › flips back to it
    request(withModel({ type: 'regenerate', conversation_id: state.conversationId }),
      { hidden: replaces ? [replaces] : [], retry: regenerate });
  }

  function continueReply() {
    const last = lastMessage();
    if (busy() || !last) return;
    request({ type: 'continue', message_id: Number(last.dataset.messageId) }, { retry: continueReply });
  }

  function stopRetry() { clearTimeout(state.retryTimer); state.retryTimer = null; }

  function abandonPending() { // nothing was stored: take the bubble back, give the text back
    const p = state.pending;
    if (!p) return null;
    stopRetry();
    state.pending = null;
    p.userEl?.remove();
    (p.hidden || []).forEach((el) => { el.hidden = false; });
    composer.restore(p.text);
    setQueueStatus('');
    refreshControls();
    return p;
  }

  /** busy / rate_limited / unavailable: retry on the tier's schedule with a visible, cancellable countdown.
   * no_workers: every retry_after seconds. No worker's status is in Redis (all stopped, or a Redis restart
   * lost the statuses until the workers republish, within a second): an outage, not load, so backing off
   * relieves nothing and would keep the person waiting minutes after the workers are back. */
  function startRetryCountdown(code, retryAfter) {
    stopRetry();
    const p = state.pending;
    p.transmitted = false;
    const delay = code === 'no_workers' ? Number(retryAfter) : Chat.retryDelay(cfg.backoff, p.attempts, retryAfter);
    const deadline = Date.now() + delay * 1000;
    p.attempts += 1;
    const label = {
      busy: 'The service is busy', unavailable: 'Briefly unavailable', no_workers: 'No model worker is available',
    }[code] || 'Rate limit reached';
    const tick = () => {
      const left = Math.ceil((deadline - Date.now()) / 1000);
      if (left <= 0) { stopRetry(); transmit(); return; }
      // Announce every 5 s (and the last seconds) so screen readers are not flooded.
      setQueueStatus(`${label} — retrying in ${left} s (attempt ${p.attempts + 1})`, 'retrying', true);
      state.retryTimer = setTimeout(tick, 1000);
    };
    tick();
  }

  function startActive(el, id) {
    const content = $('.content', el);
    content.setAttribute('aria-live', 'polite');
    content.setAttribute('aria-busy', 'true');
    state.active = { id, el, text: '', lastSeq: -1, resyncing: false, stopping: false, heardAt: Date.now() };
  }
  // A streaming reply silent for STALL_MS asks for what follows its last seq: frames published while the
  // channel layer's Redis restarted are lost on a socket that stayed open (the tail and `done` included).
  const STALL_MS = 8000;
  setInterval(() => {
    const a = state.active;
    if (!a || a.el.dataset.status !== 'streaming' || Date.now() - a.heardAt < STALL_MS) return;
    a.heardAt = Date.now();
    socket.send({ type: 'resume', message_id: a.id, after_seq: a.lastSeq });
  }, 2000);

  function endActive() { state.active = null; setQueueStatus(''); }

  function stopActive() {
    const a = state.active;
    if (!a) return;
    a.stopping = true; // if the socket is down, `open` sends the stop after the resume
    socket.send({ type: 'stop', message_id: a.id });
    refreshControls();
  }

  function setConversation(id, title) {
    if (state.conversationId !== id) {
      state.conversationId = id;
      app.dataset.conversationId = id;
      history.replaceState(null, '', sidebar.withId(cfg.detailUrl, id));
    }
    if (title) setTitle(title);
    sidebar.upsert(id, title, { toTop: true, current: true });
  }
  function setTitle(title) {
    els.title.textContent = title;
    document.title = `${title} — chatsite`;
  }

  /** After the list was re-rendered (branch switch, another tab's change): follow a reply still running. */
  function adoptActiveFromList() {
    const last = $$('.message.assistant', els.list).pop();
    if (!state.active && last && !FINAL.has(last.dataset.status) && last === lastMessage()) {
      startActive(last, Number(last.dataset.messageId));
      socket.send({ type: 'resume', message_id: state.active.id, after_seq: -1 });
    }
    refreshControls();
  }

  // ---------- Server frames ----------
  // ---------- Wiring ----------
  const socket = new Chat.Socket(cfg.wsPath, {
    status: setConn,
    frame: (m) => {
      if (state.active && m.message_id === state.active.id) state.active.heardAt = Date.now();
      if (Object.hasOwn(handlers, m.type)) handlers[m.type](m);
    },
    open() {
      if (state.unavailableBanner) { hideBanner(); state.unavailableBanner = false; }
      const a = state.active;
      if (a) {
        if (a.lastSeq < 0) a.text = ''; // replay from the start replaces what the page showed
        a.resyncing = false;
        socket.send({ type: 'resume', message_id: a.id, after_seq: a.lastSeq });
        if (a.stopping) socket.send({ type: 'stop', message_id: a.id });
      }
      if (state.pending && !state.retryTimer) transmit();
      Chat.documents?.reload().catch(() => {}); // file states sent while the socket was down
    },
    close() {
      const p = state.pending;
      if (p?.transmitted && p.frame.client_id) {
        p.transmitted = false; // a keyed send is re-sent on reconnect: the server answers a duplicate with its ticket
        p.frame.resend = true; // so the server looks for it before any load refusal
      } else if (p?.transmitted) { // sent, but the server never confirmed it: let the person decide
        abandonPending();
        showBanner('The connection dropped before the server confirmed your message. '
          + 'Reload the page to see whether it arrived, or retry.', p.retry);
      }
    },
  });
  const sidebar = Chat.sidebar.init({
    app, list: $('#conversation-list'), toggle: $('#sidebar-toggle'),
    firstPage: (app.dataset.sidebarPage || '1') === '1',
    currentId: () => state.conversationId,
    onCurrentRenamed: setTitle,
    onCurrentDeleted: () => {
      showBanner('This conversation was deleted.');
      window.location.assign(app.dataset.newUrl);
    },
  });
  const composer = Chat.composer.init({
    form: $('#composer-form'), textarea: $('#composer'), counter: $('#char-count'), maxChars: cfg.maxChars,
    editNote: $('#edit-note'), editCancel: $('#edit-cancel'),
    onSubmit: (text, editId) => sendText(text, editId),
  });
  const branches = Chat.branches.init({
    list: els.list,
    urls: { messages: app.dataset.messagesUrl, branch: app.dataset.branchUrl },
    csrf, conversationId: () => state.conversationId, busy,
    onReplaced: adoptActiveFromList,
  });
  // Server frames (frames.js).
  const handlers = Chat.frames.handlers({
    state, view, socket, sidebar, branches, busy, list: els.list, stopRetry, startActive, endActive, stopActive,
    setConversation, adoptActiveFromList, startRetryCountdown, abandonPending,
  });

  els.stop.addEventListener('click', () => {
    const p = state.pending;
    if (p && (state.retryTimer || !p.transmitted)) { abandonPending(); return; } // cancel a retry
    if (p) { p.stopRequested = true; setQueueStatus('Stopping…', 'sending'); return; }
    stopActive();
  });
  els.queueCancel.addEventListener('click', () => { abandonPending(); composer.focus(); });
  els.list.addEventListener('click', (e) => {
    const t = e.target;
    const msg = t.closest('.message');
    if (t.closest('.copy-button')) render.copyText(t.closest('pre')?.querySelector('code')?.textContent ?? '', t);
    else if (t.closest('.copy-message')) render.copyText(render.replyText(msg), t); // a continued reply: all of it
    else if (t.closest('.edit-message')) {
      if (busy()) { showBanner('Wait for the reply to finish (or stop it) before editing.'); return; }
      composer.startEdit(msg.dataset.messageId, $('.content', msg).dataset.raw ?? $('.content', msg).textContent);
    } else if (t.closest('.regenerate-button')) regenerate();
    else if (t.closest('.continue-button')) continueReply();
  });
  $('.banner-dismiss', els.banner).addEventListener('click', hideBanner);
  // A file dropped on a new chat started it (documents.js): this page now shows that conversation.
  document.addEventListener('chat:conversation', (e) => setConversation(e.detail.id, e.detail.title));

  // ---------- Start ----------
  render.hydrate(els.list);
  const last = $$('.message.assistant', els.list).pop();
  if (last && !FINAL.has(last.dataset.status)) {
    startActive(last, Number(last.dataset.messageId)); // resumed from seq -1 once connected
    if (last.dataset.status === 'queued') setQueueStatus('Queued — waiting for a place in line', 'queued');
  }
  const focused = app.dataset.focusMessageId && messageById(app.dataset.focusMessageId);
  if (focused) { focused.scrollIntoView({ block: 'center' }); focused.tabIndex = -1; } else scrollToBottom();
  refreshControls();
  composer.focus();
  socket.connect();
  window.chatReady = performance.now(); // the browser test's "interactive" mark
})();
