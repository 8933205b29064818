/* chatsite chat page: WebSocket client, streaming markdown, sidebar.
 * Plain ES2020, no build step. Protocol: docs/websocket-protocol.md.
 * Needs (loaded before this file): marked, DOMPurify, hljs from static/vendor/. */
(() => {
  'use strict';
  document.documentElement.classList.add('js');
  const app = document.getElementById('chat-app');
  if (!app) return;

  const $ = (sel, root = document) => root.querySelector(sel);
  const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));
  const els = {
    list: $('#message-list'), form: $('#composer-form'), composer: $('#composer'),
    send: $('#send-button'), stop: $('#stop-button'), conn: $('#connection-status'),
    queue: $('#queue-status'), banner: $('#chat-banner'), title: $('#conversation-title'),
    convList: $('#conversation-list'), toggle: $('#sidebar-toggle'), counter: $('#char-count'),
  };
  const ID_PLACEHOLDER = '987654321'; // the id the template reverses URLs with
  const cfg = {
    wsPath: app.dataset.wsPath || '/ws/chat/',
    maxChars: parseInt(app.dataset.maxChars, 10) || 0,
    detailUrl: app.dataset.detailUrl || `/chat/${ID_PLACEHOLDER}/`,
    firstSidebarPage: (app.dataset.sidebarPage || '1') === '1',
  };
  const FINAL = new Set(['completed', 'cancelled', 'failed', 'interrupted']);
  const state = {
    conversationId: app.dataset.conversationId ? Number(app.dataset.conversationId) : null,
    ws: null, attempts: 0, reconnectTimer: null, retryTimer: null,
    active: null,  // reply being generated: {id, el, text, lastSeq, resyncing, stopping}
    pending: null, // send/regenerate frame not yet answered by `queued`: {frame, text, userEl, replaces, transmitted, stopRequested}
  };

  // ---------- Markdown (marked -> DOMPurify; raw HTML from the model is shown as text) ----------
  const escapeHtml = (s) => String(s).replace(/[&<>"']/g,
    (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
  const canRender = Boolean(window.marked && window.DOMPurify);
  let autoDetect = false; // language auto-detection only for finished replies (it is slow)
  const md = canRender && new window.marked.Marked({
    gfm: true,
    breaks: true,
    renderer: {
      html: (tok) => (tok.block ? `<p>${escapeHtml(tok.text)}</p>` : escapeHtml(tok.text)),
      // No remote images: a model could be talked into leaking data through an image URL.
      image: (tok) => `<a href="${escapeHtml(tok.href)}">${escapeHtml(tok.text || tok.href)}</a>`,
      code: (tok) => {
        const hljs = window.hljs;
        const lang = (tok.lang || '').trim().split(/\s+/)[0].toLowerCase();
        let cls = 'hljs';
        let body = escapeHtml(tok.text);
        if (hljs && lang && hljs.getLanguage(lang)) {
          body = hljs.highlight(tok.text, { language: lang, ignoreIllegals: true }).value;
          cls += ` language-${lang}`;
        } else if (hljs && !lang && autoDetect && tok.text.length < 20000) {
          const r = hljs.highlightAuto(tok.text);
          body = r.value;
          if (r.language) cls += ` language-${r.language}`;
        }
        return `<pre><code class="${escapeHtml(cls)}">${body}</code></pre>\n`;
      },
    },
  });
  if (canRender) {
    window.DOMPurify.addHook('afterSanitizeAttributes', (node) => {
      if (node.tagName === 'A') {
        node.setAttribute('target', '_blank');
        node.setAttribute('rel', 'noopener noreferrer nofollow');
      }
    });
  }

  function renderMarkdown(contentEl, text, final) {
    if (!canRender) { contentEl.textContent = text; return; }
    autoDetect = final;
    contentEl.innerHTML = window.DOMPurify.sanitize(md.parse(text), {
      USE_PROFILES: { html: true },
      FORBID_TAGS: ['style', 'form', 'input', 'button', 'textarea', 'select'],
      FORBID_ATTR: ['style'],
    });
    contentEl.classList.add('markdown');
    for (const pre of contentEl.querySelectorAll('pre')) {
      const b = document.createElement('button');
      b.type = 'button';
      b.className = 'copy-button';
      b.textContent = 'Copy';
      pre.append(b);
    }
  }

  async function copyCode(btn) {
    const text = btn.closest('pre')?.querySelector('code')?.textContent ?? '';
    try {
      await navigator.clipboard.writeText(text);
    } catch { // no clipboard API (plain http on a LAN address): old-style copy
      const ta = Object.assign(document.createElement('textarea'), { value: text });
      document.body.append(ta);
      ta.select();
      document.execCommand('copy');
      ta.remove();
    }
    btn.textContent = 'Copied';
    setTimeout(() => { btn.textContent = 'Copy'; }, 1500);
  }

  // ---------- Message bubbles ----------
  const messageById = (id) => (id == null ? null : $(`.message[data-message-id="${Number(id)}"]`, els.list));
  const lastMessage = () => $$('.message', els.list).pop() || null;
  const nearBottom = () => els.list.scrollHeight - els.list.scrollTop - els.list.clientHeight < 80;
  const scrollToBottom = () => { els.list.scrollTop = els.list.scrollHeight; };

  function addMessage(role, id, status) {
    $('#empty-state')?.remove();
    const el = document.createElement('article');
    el.className = `message ${role}`;
    el.dataset.messageId = id ?? '';
    el.dataset.status = status;
    el.dataset.finishReason = '';
    el.innerHTML = `<header class="role">${role === 'user' ? 'You' : 'Assistant'}</header>
      <div class="content"></div><p class="status-line" hidden></p>
      <footer class="meta"></footer><div class="actions"></div>`;
    els.list.append(el);
    scrollToBottom();
    return el;
  }

  function setOmitted(el, n) {
    let note = $('.omitted-note', el);
    if (!n) { note?.remove(); return; }
    if (!note) {
      note = document.createElement('p');
      note.className = 'omitted-note';
      $('.content', el).before(note);
    }
    note.textContent = `${n} earlier ${n === 1 ? 'message was' : 'messages were'} left out of the model's context`;
  }

  function setStatusLine(el, text, isError = false) {
    const line = $('.status-line', el);
    line.textContent = text || '';
    line.hidden = !text;
    line.classList.toggle('error', isError);
  }

  function finishBubble(el, status, finishReason, error) {
    el.dataset.status = status;
    el.dataset.finishReason = finishReason || '';
    $('.content', el).setAttribute('aria-busy', 'false');
    if (status === 'failed') setStatusLine(el, `Failed: ${error || 'the reply could not be generated.'}`, true);
    else if (status === 'interrupted') setStatusLine(el, 'Interrupted — the worker stopped before the reply finished.', true);
    else if (status === 'cancelled') setStatusLine(el, 'Stopped — the partial reply was kept.');
    else if (finishReason === 'length') setStatusLine(el, 'Cut off at the reply length limit.');
    else setStatusLine(el, '');
  }

  // ---------- Controls, banner, status lines ----------
  function refreshControls() {
    const busy = Boolean(state.active || state.pending);
    els.send.disabled = busy;
    els.stop.hidden = !busy;
    els.stop.disabled = Boolean(state.active?.stopping);
    $$('.regenerate-button', els.list).forEach((b) => b.remove());
    const last = lastMessage();
    if (busy || !last || !state.conversationId) return;
    const isAssistant = last.classList.contains('assistant');
    if (isAssistant ? !FINAL.has(last.dataset.status) : !last.classList.contains('user')) return;
    const b = document.createElement('button');
    b.type = 'button';
    b.className = 'button small regenerate-button';
    b.textContent = (!isAssistant || ['failed', 'interrupted'].includes(last.dataset.status)) ? 'Retry' : 'Regenerate';
    $('.actions', last).append(b);
  }

  function setQueueStatus(text, kind = '') {
    els.queue.textContent = text;
    els.queue.hidden = !text;
    els.queue.dataset.state = text ? kind : '';
  }

  function setConn(st, text) {
    els.conn.dataset.state = st;
    els.conn.textContent = text;
  }

  function showBanner(text, retry = null) {
    $('.banner-text', els.banner).textContent = text;
    const btn = $('.banner-retry', els.banner);
    btn.hidden = !retry;
    btn.onclick = retry && (() => { hideBanner(); retry(); });
    els.banner.hidden = false;
  }
  const hideBanner = () => { els.banner.hidden = true; };

  // ---------- Requests ----------
  function sendFrame(frame) {
    if (state.ws?.readyState !== WebSocket.OPEN) return false;
    state.ws.send(JSON.stringify(frame));
    return true;
  }

  function request(frame, extra = {}) {
    hideBanner();
    state.pending = { frame, transmitted: false, stopRequested: false, ...extra };
    transmit();
    refreshControls();
  }

  function transmit() { // (re)send the pending frame; if the socket is down, `open` sends it
    const p = state.pending;
    if (!p) return;
    p.transmitted = sendFrame(p.frame);
    setQueueStatus(p.transmitted ? 'Sending…' : 'Waiting for the connection…', 'sending');
  }

  function newClientId() { // a UUID v4; crypto.randomUUID needs a secure context, getRandomValues does not
    if (crypto.randomUUID) return crypto.randomUUID();
    const b = crypto.getRandomValues(new Uint8Array(16));
    b[6] = (b[6] & 0x0f) | 0x40; b[8] = (b[8] & 0x3f) | 0x80;
    const h = [...b].map((x) => x.toString(16).padStart(2, '0')).join('');
    return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
  }

  function sendText(text) {
    const userEl = addMessage('user', null, 'pending');
    $('.content', userEl).textContent = text;
    // client_id: the idempotency key, so a resend after a dropped connection never stores the message twice.
    request({ type: 'send', conversation_id: state.conversationId, content: text, client_id: newClientId() },
      { text, userEl, retry: () => sendText(text) });
  }

  function regenerate() {
    if (state.active || state.pending || !state.conversationId) return;
    const last = lastMessage();
    request({ type: 'regenerate', conversation_id: state.conversationId },
      { replaces: last?.classList.contains('assistant') ? last : null, retry: regenerate });
  }

  function stopRetry() { clearInterval(state.retryTimer); state.retryTimer = null; }

  function abandonPending() { // nothing was stored: take the bubble back, give the text back
    const p = state.pending;
    if (!p) return null;
    stopRetry();
    state.pending = null;
    p.userEl?.remove();
    if (p.text && !els.composer.value) { els.composer.value = p.text; autosize(); }
    setQueueStatus('');
    refreshControls();
    return p;
  }

  function startRetryCountdown(code, seconds) {
    stopRetry();
    state.pending.transmitted = false;
    let left = Math.max(1, Math.ceil(seconds));
    const label = { busy: 'Busy', unavailable: 'Briefly unavailable' }[code] || 'Rate limit reached';
    const tick = () => {
      if (left <= 0) { stopRetry(); transmit(); return; }
      setQueueStatus(`${label} — retrying in ${left} s`, 'retrying');
      left -= 1;
    };
    tick();
    state.retryTimer = setInterval(tick, 1000);
  }

  function startActive(el, id) {
    const content = $('.content', el);
    content.setAttribute('aria-live', 'polite');
    content.setAttribute('aria-busy', 'true');
    state.active = { id, el, text: '', lastSeq: -1, resyncing: false, stopping: false };
  }

  function endActive() {
    state.active = null;
    setQueueStatus('');
  }

  // ---------- Sidebar ----------
  const withId = (s, id) => s.split(ID_PLACEHOLDER).join(String(id));

  function setConversation(id, title) {
    if (state.conversationId !== id) {
      state.conversationId = id;
      app.dataset.conversationId = id;
      history.replaceState(null, '', withId(cfg.detailUrl, id));
    }
    if (title) {
      els.title.textContent = title;
      document.title = `${title} — chatsite`;
    }
    if (!els.convList) return;
    let item = $(`.conversation-item[data-conversation-id="${id}"]`, els.convList);
    if (!item && cfg.firstSidebarPage) {
      const frag = $('#conversation-item-template').content.cloneNode(true);
      for (const node of frag.querySelectorAll('[href],[action],[id],[for],[data-conversation-id]')) {
        for (const attr of ['href', 'action', 'id', 'for', 'data-conversation-id']) {
          if (node.hasAttribute(attr)) node.setAttribute(attr, withId(node.getAttribute(attr), id));
        }
      }
      item = frag.querySelector('.conversation-item');
      $('.sidebar-empty', els.convList)?.remove();
    }
    if (!item) return;
    if (title) {
      $('.conversation-title', item).textContent = title;
      $('.rename-form input[name="title"]', item).value = title;
    }
    if (cfg.firstSidebarPage) els.convList.prepend(item); // newest first
    $$('.conversation-link[aria-current]', els.convList).forEach((a) => a.removeAttribute('aria-current'));
    $('.conversation-link', item).setAttribute('aria-current', 'page');
  }

  // ---------- Server frames ----------
  const handlers = {
    queued(m) {
      const a = state.active;
      if (a && m.message_id === a.id) { // position update, or the answer to a resume
        setQueueStatus(`Queued — #${m.position} in line`, 'queued');
        return;
      }
      const p = state.pending;
      if (!p) return;
      stopRetry();
      state.pending = null;
      if (p.userEl) {
        p.userEl.dataset.messageId = m.user_message_id ?? '';
        p.userEl.dataset.status = 'completed';
      }
      p.replaces?.remove();
      setConversation(m.conversation_id, m.title);
      const el = addMessage('assistant', m.message_id, 'queued');
      setOmitted(el, m.omitted_messages);
      startActive(el, m.message_id);
      setQueueStatus(`Queued — #${m.position} in line`, 'queued');
      if (p.stopRequested) stopActive();
      refreshControls();
    },
    started(m) {
      if (state.active?.id !== m.message_id) return;
      state.active.el.dataset.status = 'streaming';
      setQueueStatus('');
    },
    token(m) {
      const a = state.active;
      if (!a || m.message_id !== a.id || m.seq <= a.lastSeq) return; // not ours, or already seen
      if (m.seq > a.lastSeq + 1) { // a gap: ask for a replay from what we have
        if (!a.resyncing) sendFrame({ type: 'resume', message_id: a.id, after_seq: a.lastSeq });
        a.resyncing = true;
        return;
      }
      a.resyncing = false;
      if (a.el.dataset.status === 'queued') { a.el.dataset.status = 'streaming'; setQueueStatus(''); }
      a.text += m.text;
      a.lastSeq = m.seq;
      scheduleRender();
    },
    done(m) {
      const el = messageById(m.message_id);
      if (!el) return;
      const stick = nearBottom();
      if (state.active?.id === m.message_id) endActive();
      finishBubble(el, m.status, m.finish_reason, m.error);
      renderMarkdown($('.content', el), m.content ?? '', true);
      const parts = [];
      if (m.usage?.completion_tokens) parts.push(`${m.usage.completion_tokens} tokens`);
      if (m.ttft_ms != null) parts.push(`first token ${m.ttft_ms} ms`);
      if (m.duration_ms != null) parts.push(`${(m.duration_ms / 1000).toFixed(1)} s`);
      $('.meta', el).textContent = parts.join(' · ');
      if (stick) scrollToBottom();
      refreshControls();
    },
    error(m) {
      const p = state.pending;
      if (['rate_limited', 'busy', 'unavailable'].includes(m.code) && m.retry_after != null && p) {
        startRetryCountdown(m.code, m.retry_after);
        return;
      }
      const el = messageById(m.message_id);
      if (el?.classList.contains('assistant') && !FINAL.has(el.dataset.status)) { // about a reply in flight
        if (state.active?.id === m.message_id) endActive();
        finishBubble(el, 'failed', null, m.message);
        refreshControls();
        return;
      }
      if (p && !state.active) {
        abandonPending();
        showBanner(m.message || 'The message could not be sent.', p.retry);
        return;
      }
      if (state.active?.stopping) { state.active.stopping = false; refreshControls(); }
      showBanner(m.message || `Error: ${m.code}`);
    },
  };

  let renderScheduled = false;
  function scheduleRender() {
    if (renderScheduled) return;
    renderScheduled = true;
    requestAnimationFrame(() => {
      renderScheduled = false;
      const a = state.active;
      if (!a) return;
      const stick = nearBottom();
      renderMarkdown($('.content', a.el), a.text, false);
      if (stick) scrollToBottom();
    });
  }

  function stopActive() {
    const a = state.active;
    if (!a) return;
    a.stopping = true; // if the socket is down, `open` sends the stop after the resume
    sendFrame({ type: 'stop', message_id: a.id });
    refreshControls();
  }

  // ---------- Connection ----------
  function connect() {
    clearTimeout(state.reconnectTimer);
    setConn(state.attempts ? 'reconnecting' : 'connecting', state.attempts ? 'Reconnecting…' : 'Connecting…');
    const ws = new WebSocket(`${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}${cfg.wsPath}`);
    state.ws = ws;
    ws.addEventListener('open', () => {
      state.attempts = 0;
      setConn('open', 'Connected');
      const a = state.active;
      if (a) {
        if (a.lastSeq < 0) a.text = ''; // replay from the start replaces what the page showed
        a.resyncing = false;
        sendFrame({ type: 'resume', message_id: a.id, after_seq: a.lastSeq });
        if (a.stopping) sendFrame({ type: 'stop', message_id: a.id });
      }
      if (state.pending && !state.retryTimer) transmit();
    });
    ws.addEventListener('message', (ev) => {
      let m;
      try { m = JSON.parse(ev.data); } catch { return; }
      if (m && Object.hasOwn(handlers, m.type)) handlers[m.type](m);
    });
    ws.addEventListener('close', (ev) => {
      if (state.ws !== ws) return;
      state.ws = null;
      const p = state.pending;
      if (p?.transmitted && p.frame.client_id) {
        p.transmitted = false; // a keyed send is re-sent on reconnect: the server answers a duplicate with its ticket
      } else if (p?.transmitted) { // sent, but the server never confirmed it: let the person decide
        abandonPending();
        showBanner('The connection dropped before the server confirmed your message. '
          + 'Reload the page to see whether it arrived, or retry.', p.retry);
      }
      if (ev.code === 4401 || ev.code === 4403) { setConn('closed', 'Signed out — reload the page'); return; }
      const delay = Math.min(15, 2 ** state.attempts);
      state.attempts += 1;
      setConn('reconnecting', 'Reconnecting…');
      state.reconnectTimer = setTimeout(connect, delay * 1000);
    });
  }
  window.addEventListener('online', () => { if (!state.ws) { state.attempts = Math.max(state.attempts, 1); connect(); } });

  // ---------- Composer ----------
  function autosize() {
    els.composer.style.height = 'auto';
    els.composer.style.height = `${Math.min(els.composer.scrollHeight, 240)}px`;
    const n = els.composer.value.length;
    els.counter.hidden = !cfg.maxChars || n < cfg.maxChars * 0.8;
    els.counter.textContent = `${n} / ${cfg.maxChars}`;
  }

  function submitComposer() {
    const text = els.composer.value;
    if (!text.trim() || state.active || state.pending) return;
    if (cfg.maxChars && text.length > cfg.maxChars) {
      showBanner(`The message is too long (at most ${cfg.maxChars} characters).`);
      return;
    }
    els.composer.value = '';
    autosize();
    sendText(text);
  }

  els.form.addEventListener('submit', (e) => { e.preventDefault(); submitComposer(); });
  els.composer.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); submitComposer(); }
  });
  els.composer.addEventListener('input', autosize);
  els.stop.addEventListener('click', () => {
    const p = state.pending;
    if (p && (state.retryTimer || !p.transmitted)) { abandonPending(); return; } // cancel a retry
    if (p) { p.stopRequested = true; setQueueStatus('Stopping…', 'sending'); return; }
    stopActive();
  });
  els.list.addEventListener('click', (e) => {
    const copy = e.target.closest('.copy-button');
    if (copy) copyCode(copy);
    else if (e.target.closest('.regenerate-button')) regenerate();
  });
  $('.banner-dismiss', els.banner).addEventListener('click', hideBanner);

  // Sidebar: confirm deletes; toggle on narrow screens.
  document.addEventListener('submit', (e) => {
    const msg = e.target.dataset?.confirm;
    if (msg && !window.confirm(msg)) e.preventDefault();
  });
  const setSidebar = (open) => {
    app.classList.toggle('sidebar-open', open);
    els.toggle.setAttribute('aria-expanded', String(open));
  };
  els.toggle.addEventListener('click', () => setSidebar(!app.classList.contains('sidebar-open')));
  $('[data-close-sidebar]', app)?.addEventListener('click', () => setSidebar(false));
  document.addEventListener('keydown', (e) => { if (e.key === 'Escape') setSidebar(false); });

  // ---------- Start ----------
  for (const el of $$('.message.assistant', els.list)) {
    const content = $('.content', el);
    renderMarkdown(content, content.textContent, FINAL.has(el.dataset.status));
  }
  const last = $$('.message.assistant', els.list).pop();
  if (last && (last.dataset.status === 'queued' || last.dataset.status === 'streaming')) {
    startActive(last, Number(last.dataset.messageId)); // resumed from seq -1 once connected
    if (last.dataset.status === 'queued') setQueueStatus('Queued — waiting for a place in line', 'queued');
  }
  autosize();
  scrollToBottom();
  refreshControls();
  connect();
})();
