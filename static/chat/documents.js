/* chatsite chat page: files in the conversation. Add by the "Add file" button or by dropping a file on the
 * chat; the upload shows its own progress, then the server's `document` frames (over the chat socket) show
 * the processing (pages read, passages indexed) until the file is ready or failed. Citation chips under a
 * reply open the cited passage in a dialog. Plain ES2020, no build step. Exposes window.Chat.documents. */
(() => {
  'use strict';
  const Chat = (window.Chat = window.Chat || {});
  const { $ } = Chat;
  const app = document.getElementById('chat-app');
  if (!app) return;

  const els = {
    section: $('#documents'), list: $('#document-list'), input: $('#document-input'),
    attach: $('#attach-button'), drop: $('#drop-zone'), main: $('.chat-main'), dialog: $('#passage-dialog'),
  };
  const maxBytes = Number(app.dataset.documentsMaxBytes) || 0;
  const conversationId = () => (app.dataset.conversationId ? Number(app.dataset.conversationId) : null);
  const withId = (url, id) => url.replace('987654321', String(id));
  const csrf = () => $('input[name="csrfmiddlewaretoken"]', app)?.value || '';
  const KIND = { pdf: 'PDF', docx: 'DOCX', markdown: 'MD', text: 'TXT' };
  const STAGE = { queued: 'Waiting to be read…', extracting: 'Reading', embedding: 'Indexing' };

  const mib = (n) => `${(n / (1024 * 1024)).toFixed(1)} MiB`;
  const itemById = (id) => $(`.document-item[data-document-id="${Number(id)}"]`, els.list);

  function stateText(d) {
    if (d.status === 'ready') return `Ready · ${d.chunk_count} passage${d.chunk_count === 1 ? '' : 's'}`;
    if (d.status === 'failed') return `Failed: ${d.error}`;
    if (d.stage === 'extracting') {
      return d.pages ? `Reading page ${d.progress_done} of ${d.progress_total}…` : 'Reading…';
    }
    if (d.stage === 'embedding') return `Indexing passage ${d.progress_done} of ${d.progress_total}…`;
    return STAGE[d.stage] || 'Processing…';
  }

  function item(id) {
    const li = document.createElement('li');
    li.className = 'document-item';
    if (id != null) { li.dataset.documentId = id; li.id = `document-${id}`; }
    li.innerHTML = `<span class="document-kind" aria-hidden="true"></span><span class="document-name"></span>
      <span class="document-state" role="status"></span><progress class="document-progress" max="1" value="0"></progress>
      <button type="button" class="icon-text-button document-delete">×</button>`;
    return li;
  }

  /** Create or update the row of document `d` (the server's document_dict). */
  function show(d) {
    if (d.conversation_id !== conversationId()) return;
    let li = itemById(d.id);
    if (!li) { li = item(d.id); els.list.append(li); }
    li.dataset.status = d.status;
    $('.document-kind', li).textContent = KIND[d.kind] || 'FILE';
    const name = $('.document-name', li);
    name.textContent = d.name; name.title = d.name;
    $('.document-state', li).textContent = stateText(d);
    const bar = $('.document-progress', li);
    bar.hidden = d.status !== 'processing';
    bar.value = d.progress || 0;
    $('.document-delete', li).setAttribute('aria-label', `Remove ${d.name}`);
    els.section.hidden = false;
  }

  function remove(id) {
    itemById(id)?.remove();
    els.section.hidden = !els.list.children.length;
  }

  /** A row for a file being sent (before the server knows it): shows the upload's own progress. */
  function uploading(file) {
    const li = item(null);
    li.dataset.status = 'uploading';
    $('.document-kind', li).textContent = 'FILE';
    $('.document-name', li).textContent = file.name;
    $('.document-state', li).textContent = 'Uploading…';
    $('.document-delete', li).hidden = true;
    els.list.append(li);
    els.section.hidden = false;
    return li;
  }

  function upload(file) {
    if (!file) return;
    if (maxBytes && file.size > maxBytes) {
      Chat.showBanner(`"${file.name}" is ${mib(file.size)}; files are limited to ${mib(maxBytes)}.`);
      return;
    }
    const id = conversationId();
    const url = id ? withId(app.dataset.documentUploadUrl, id) : app.dataset.documentUploadNewUrl;
    const li = uploading(file);
    const body = new FormData();
    body.append('file', file);
    const xhr = new XMLHttpRequest(); // fetch() has no upload progress events
    xhr.open('POST', url);
    xhr.setRequestHeader('X-CSRFToken', csrf());
    xhr.setRequestHeader('Accept', 'application/json');
    xhr.upload.addEventListener('progress', (e) => {
      if (!e.lengthComputable) return;
      $('.document-state', li).textContent = `Uploading ${Math.round((100 * e.loaded) / e.total)}%…`;
      $('.document-progress', li).value = e.loaded / e.total;
    });
    xhr.addEventListener('load', () => {
      let data = {};
      try { data = JSON.parse(xhr.responseText); } catch { /* an HTML error page */ }
      if (xhr.status !== 201) {
        li.remove();
        els.section.hidden = !els.list.children.length;
        Chat.showBanner(`"${file.name}" was not added: ${data.error || `the server answered ${xhr.status}.`}`);
        return;
      }
      li.remove();
      if (!id) document.dispatchEvent(new CustomEvent('chat:conversation', { detail: data.conversation }));
      const existing = itemById(data.document.id); // a frame may have been quicker than this answer
      if (!existing || existing.dataset.status === 'processing') show(data.document);
    });
    xhr.addEventListener('error', () => {
      li.remove();
      els.section.hidden = !els.list.children.length;
      Chat.showBanner(`"${file.name}" was not added: the connection failed. Try again.`);
    });
    xhr.send(body);
  }

  async function destroy(li) {
    const id = li.dataset.documentId;
    const name = $('.document-name', li).textContent;
    if (!id || !window.confirm(`Remove "${name}" from this chat? Its passages are deleted too.`)) return;
    const response = await fetch(withId(app.dataset.documentDeleteUrl, id), {
      method: 'POST', headers: { 'X-CSRFToken': csrf(), Accept: 'application/json' },
    });
    if (response.ok || response.status === 404) remove(id);
    else Chat.showBanner(`"${name}" could not be removed (the server answered ${response.status}).`);
  }

  /** Re-read the list (after a reconnect: frames sent while the socket was down were missed). */
  async function reload() {
    const id = conversationId();
    if (!id) return;
    const response = await fetch(withId(app.dataset.documentsUrl, id), { headers: { Accept: 'application/json' } });
    if (!response.ok) return;
    const { documents } = await response.json();
    const seen = new Set(documents.map((d) => String(d.id)));
    for (const li of [...els.list.children]) {
      if (li.dataset.documentId && !seen.has(li.dataset.documentId)) li.remove();
    }
    documents.forEach(show);
    els.section.hidden = !els.list.children.length;
  }

  // ---------- Citation chips ----------
  /** Chips under a reply for `citations` ([{marker, chunk_id, name, page, excerpt}]). */
  function renderCitations(el, citations) {
    $('.citations', el)?.remove();
    if (!citations?.length) return;
    const nav = document.createElement('nav');
    nav.className = 'citations';
    nav.setAttribute('aria-label', 'Sources');
    for (const c of citations) {
      const chip = document.createElement('button');
      chip.type = 'button';
      chip.className = 'citation-chip';
      chip.dataset.chunkId = c.chunk_id;
      chip.title = c.excerpt || '';
      chip.textContent = `[${c.marker}] ${c.name}${c.page ? ` · p. ${c.page}` : ''}`;
      nav.append(chip);
    }
    $('.meta', el).before(nav);
  }

  async function openPassage(chunkId) {
    const response = await fetch(withId(app.dataset.passageUrl, chunkId), { headers: { Accept: 'application/json' } });
    if (!response.ok) { Chat.showBanner('This passage is no longer available (its file was removed).'); return; }
    const p = await response.json();
    $('#passage-title', els.dialog).textContent = p.name;
    $('.passage-source', els.dialog).textContent = p.page ? `Page ${p.page} · passage ${p.ordinal + 1}` : `Passage ${p.ordinal + 1}`;
    $('.passage-text', els.dialog).textContent = p.text;
    els.dialog.showModal();
  }

  // ---------- Wiring ----------
  els.attach.addEventListener('click', () => els.input.click());
  els.input.addEventListener('change', () => { [...els.input.files].forEach(upload); els.input.value = ''; });
  els.list.addEventListener('click', (e) => {
    const li = e.target.closest('.document-delete') && e.target.closest('.document-item');
    if (li) destroy(li);
  });
  document.addEventListener('click', (e) => {
    const chip = e.target.closest('.citation-chip');
    if (chip) openPassage(chip.dataset.chunkId);
  });
  // Drag and drop anywhere on the chat column; the overlay says what dropping does.
  let depth = 0;
  const hasFiles = (e) => [...(e.dataTransfer?.types || [])].includes('Files');
  els.main.addEventListener('dragenter', (e) => {
    if (!hasFiles(e)) return;
    e.preventDefault();
    depth += 1;
    els.drop.hidden = false;
  });
  els.main.addEventListener('dragover', (e) => { if (hasFiles(e)) { e.preventDefault(); e.dataTransfer.dropEffect = 'copy'; } });
  els.main.addEventListener('dragleave', () => { depth = Math.max(0, depth - 1); if (!depth) els.drop.hidden = true; });
  els.main.addEventListener('drop', (e) => {
    if (!hasFiles(e)) return;
    e.preventDefault();
    depth = 0;
    els.drop.hidden = true;
    [...e.dataTransfer.files].forEach(upload);
  });

  Chat.documents = {
    /** A `document` frame from the socket. */
    frame(m) { if (m.deleted) remove(m.document.id); else show(m.document); },
    reload, renderCitations, upload,
  };
})();
