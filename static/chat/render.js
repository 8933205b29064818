/* chatsite chat page: rendering. Markdown (marked -> DOMPurify; raw HTML from the model is shown as text),
 * code highlighting, message bubbles and their status lines. Exposes window.Chat.render.
 * Needs (loaded before this file): marked, DOMPurify, hljs from static/vendor/. */
(() => {
  'use strict';
  const Chat = (window.Chat = window.Chat || {});
  const $ = (sel, root = document) => root.querySelector(sel);
  Chat.$ = $;
  Chat.$$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));
  Chat.FINAL = new Set(['completed', 'cancelled', 'failed', 'interrupted', 'blocked']);
  Chat.BLOCKED_REPLY = 'This reply was stopped by the content policy and removed.';
  Chat.BLOCKED_INPUT = 'Not sent — this message was blocked by the content policy.';

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

  /** Render `text` as sanitized markdown into `contentEl`; the raw text is kept for "Copy" (unless
   * `keepRaw`: a reply showing its continuations' text too keeps its own). */
  function markdown(contentEl, text, final, keepRaw = false) {
    if (!keepRaw) contentEl.dataset.raw = text;
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
      b.textContent = 'Copy code';
      pre.append(b);
    }
  }

  async function copyText(text, btn) {
    try {
      await navigator.clipboard.writeText(text);
    } catch { // no clipboard API (plain http on a LAN address): old-style copy
      const ta = Object.assign(document.createElement('textarea'), { value: text });
      document.body.append(ta);
      ta.select();
      document.execCommand('copy');
      ta.remove();
    }
    if (btn) {
      const label = btn.textContent;
      btn.textContent = 'Copied';
      setTimeout(() => { btn.textContent = label; }, 1500);
    }
  }

  /** A new bubble with the structure of templates/chat/_message.html. */
  function bubble(role, id, status) {
    const el = document.createElement('article');
    el.className = `message ${role}`;
    el.dataset.messageId = id ?? '';
    el.dataset.status = status;
    el.dataset.finishReason = '';
    el.setAttribute('aria-label', role === 'user' ? 'You' : 'Assistant');
    el.innerHTML = `<header class="role">${role === 'user' ? 'You' : 'Assistant'}</header>
      <div class="content"></div><p class="status-line" hidden></p>
      <footer class="meta"></footer><div class="message-tools"><div class="actions"></div></div>`;
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
    line.classList.toggle('blocked-notice', text === Chat.BLOCKED_REPLY || text === Chat.BLOCKED_INPUT);
  }

  /** Standard per-message buttons once a message is final: Copy, and Edit on the person's own. */
  function addTools(el) {
    const actions = $('.actions', el);
    if (!$('.copy-message', actions)) {
      const copy = Object.assign(document.createElement('button'),
        { type: 'button', className: 'button small copy-message', textContent: 'Copy' });
      actions.prepend(copy);
    }
    if (el.classList.contains('user') && !$('.edit-message', actions)) {
      actions.append(Object.assign(document.createElement('button'),
        { type: 'button', className: 'button small edit-message', textContent: 'Edit' }));
    }
  }

  function finish(el, m) {
    el.dataset.status = m.status;
    el.dataset.finishReason = m.finish_reason || '';
    const content = $('.content', el);
    content.setAttribute('aria-busy', 'false');
    content.removeAttribute('aria-live');
    if (m.status === 'blocked') setStatusLine(el, Chat.BLOCKED_REPLY, true);
    else if (m.status === 'failed') setStatusLine(el, `Failed: ${m.error || 'the reply could not be generated.'}`, true);
    else if (m.status === 'interrupted') setStatusLine(el, 'Interrupted — the worker stopped before the reply finished.', true);
    else if (m.status === 'cancelled') setStatusLine(el, 'Stopped — the partial reply was kept.');
    else if (m.finish_reason === 'length') setStatusLine(el, 'Cut off at the reply length limit.');
    else setStatusLine(el, '');
    if ('content' in m) markdown(content, m.content ?? '', true);
    const parts = [];
    if (m.usage?.completion_tokens) parts.push(`${m.usage.completion_tokens} tokens`);
    if (m.ttft_ms != null) parts.push(`first token ${m.ttft_ms} ms`);
    if (m.duration_ms != null) parts.push(`${(m.duration_ms / 1000).toFixed(1)} s`);
    if (el.dataset.model) parts.push(el.dataset.model); // the model that answered
    if (parts.length) $('.meta', el).textContent = parts.join(' · ');
    addTools(el);
  }

  /* Continue: the server stores a continued reply as its own message, a child of the reply cut at the length
   * limit (so branches, regenerate and context work as for any reply). On the page the chain reads as one
   * reply: the first bubble shows the joined text of itself and its continuations, each continuation keeps
   * its own text hidden (for streaming and Copy) and shows only its status, meta and tools underneath. */
  const isCut = (el) => el?.matches('.message.assistant[data-finish-reason="length"]:not([hidden])');
  const shownBefore = (el) => {
    let p = el.previousElementSibling;
    while (p && p.hidden) p = p.previousElementSibling;
    return p;
  };

  /** The bubbles of the reply `el` belongs to, head first (just `[el]` when it was never continued). */
  function chainOf(el) {
    let head = el;
    while (head.classList.contains('assistant') && isCut(shownBefore(head))) head = shownBefore(head);
    const chain = [head];
    for (let n = head; isCut(n);) {
      n = n.nextElementSibling;
      while (n && n.hidden) n = n.nextElementSibling;
      if (!n || !n.classList.contains('assistant')) break;
      chain.push(n);
    }
    return chain;
  }

  /** The whole reply's text (what "Copy" on any of its bubbles copies). */
  const replyText = (el) => chainOf(el).map((m) => $('.content', m).dataset.raw ?? $('.content', m).textContent).join('');

  /** Mark continued/continuation bubbles under `root` and show each chain's joined text in its head. */
  function joinContinuations(root) {
    for (const el of Chat.$$('.message.continued, .message.continuation', root)) {
      el.classList.remove('continued', 'continuation');
    }
    for (const head of Chat.$$('.message.assistant', root)) {
      if (head.hidden || isCut(shownBefore(head))) continue;
      const chain = chainOf(head);
      if (chain.length < 2) continue;
      chain.slice(0, -1).forEach((m) => m.classList.add('continued'));
      chain.slice(1).forEach((m) => m.classList.add('continuation'));
      const final = Chat.FINAL.has(chain[chain.length - 1].dataset.status);
      const content = $('.content', head);
      markdown(content, replyText(head), final, true);
      // The continuation's own text is hidden: its stream is read out where it shows, in the head.
      if (final) { content.removeAttribute('aria-live'); content.setAttribute('aria-busy', 'false'); }
      else { content.setAttribute('aria-live', 'polite'); content.setAttribute('aria-busy', 'true'); }
    }
  }

  /** Render every server-rendered bubble under `root` (page load, a fetched page of messages). */
  function hydrate(root) {
    for (const el of Chat.$$('.message', root)) {
      const content = $('.content', el);
      if (content.dataset.raw === undefined) {
        const text = content.textContent;
        if (el.classList.contains('assistant')) markdown(content, text, Chat.FINAL.has(el.dataset.status));
        else content.dataset.raw = text;
      }
    }
  }

  Chat.render = {
    markdown, copyText, bubble, setOmitted, setStatusLine, finish, hydrate, addTools, joinContinuations, replyText,
  };
})();
