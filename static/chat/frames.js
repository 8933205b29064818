/* chatsite chat page: what each server frame does to the page: queued, started, token, done, error,
 * conversation (tab sync), session_ended and document (docs/websocket-protocol.md). Exposes
 * window.Chat.frames; chat.js owns the state and the requests these handlers act on. */
(() => {
  'use strict';
  const Chat = (window.Chat = window.Chat || {});
  const { $, FINAL, render } = Chat;

  // Refusals of a send/regenerate that waiting cures: the page re-sends the same frame after a countdown.
  const RETRIED = new Set(['rate_limited', 'busy', 'unavailable', 'no_workers']);

  /** The handlers by frame type, for the controller `c` (chat.js): its `state`, `view` (view.js), message
   * `list`, `socket`, `sidebar`, `branches`, `busy()` and the actions they call (`stopRetry`, `startActive`,
   * `endActive`, `stopActive`, `setConversation`, `adoptActiveFromList`, `startRetryCountdown`,
   * `abandonPending`). A token is drawn on the next animation frame, once per frame however many arrive. */
  function handlers(c) {
    const { state, view, socket, sidebar, branches, busy } = c;
    const { addMessage, messageById, nearBottom, scrollToBottom, refreshControls, setQueueStatus, showBanner } = view;
    const { stopRetry, startActive, endActive, stopActive, setConversation, adoptActiveFromList } = c;
    const { startRetryCountdown, abandonPending } = c;

    let renderScheduled = false;
    function scheduleRender() {
      if (renderScheduled) return;
      renderScheduled = true;
      requestAnimationFrame(() => {
        renderScheduled = false;
        const a = state.active;
        if (!a) return;
        const stick = nearBottom();
        render.markdown($('.content', a.el), a.text, false);
        if (a.el.classList.contains('continuation')) render.joinContinuations(c.list); // shown in its head
        if (stick) scrollToBottom();
      });
    }

    return {
      queued(m) {
        const a = state.active;
        if (a && m.message_id === a.id) { setQueueStatus(`Queued — #${m.position} in line`, 'queued'); return; }
        const p = state.pending;
        if (!p) return;
        stopRetry();
        state.pending = null;
        if (p.userEl) {
          p.userEl.dataset.messageId = m.user_message_id ?? '';
          p.userEl.dataset.status = 'completed';
          $('.content', p.userEl).dataset.raw = p.text;
          render.addTools(p.userEl);
        }
        (p.hidden || []).forEach((el) => el.remove());
        setConversation(m.conversation_id, m.title);
        const el = addMessage('assistant', m.message_id, 'queued');
        el.dataset.model = m.model || '';
        render.setOmitted(el, m.omitted_messages);
        startActive(el, m.message_id);
        // A new branch (edit, regenerate): once it is done, re-read the branch for its "‹ n/m ›" switchers.
        state.active.reloadOnDone = p.frame.type === 'edit' || p.frame.type === 'regenerate';
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
          if (!a.resyncing) socket.send({ type: 'resume', message_id: a.id, after_seq: a.lastSeq });
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
        const reload = (state.active?.id === m.message_id && state.active.reloadOnDone) || branches.isStale();
        if (state.active?.id === m.message_id) endActive();
        render.finish(el, m);
        if (m.citations) Chat.documents?.renderCitations(el, m.citations);
        if (stick) scrollToBottom();
        refreshControls();
        if (reload) branches.reload().then(adoptActiveFromList).then(scrollToBottom).catch(() => {});
      },
      error(m) {
        const p = state.pending;
        if (RETRIED.has(m.code) && m.retry_after != null && p) {
          // Admission refused a resend only after finding nothing stored under its client_id: the next try is
          // a plain send again (the server may refuse it from its cached load figures).
          if (m.code === 'busy' || m.code === 'rate_limited') delete p.frame.resend;
          startRetryCountdown(m.code, m.retry_after);
          return;
        }
        const el = messageById(m.message_id);
        if (el?.classList.contains('assistant') && !FINAL.has(el.dataset.status)) { // about a reply in flight
          if (state.active?.id === m.message_id) endActive();
          render.finish(el, { status: 'failed', error: m.message });
          refreshControls();
          return;
        }
        if (m.code === 'content_policy' && p && !state.active) {
          // The message is stored, marked blocked, and no reply was queued: keep the bubble with a notice.
          stopRetry();
          state.pending = null;
          setQueueStatus('');
          if (p.userEl) {
            p.userEl.dataset.messageId = m.message_id ?? '';
            p.userEl.dataset.status = 'blocked';
            $('.content', p.userEl).dataset.raw = p.text;
            render.setStatusLine(p.userEl, Chat.BLOCKED_INPUT, true);
          }
          (p.hidden || []).forEach((el) => el.remove());
          if (m.conversation_id) setConversation(m.conversation_id, m.title || '');
          refreshControls();
          return;
        }
        if (p && !state.active) {
          abandonPending();
          // A message too long for the plan (or a model it does not offer) cannot succeed by retrying.
          const final = ['context_too_long', 'invalid_request', 'model_not_found'].includes(m.code);
          showBanner(m.message || 'The message could not be sent.', final ? null : p.retry);
          return;
        }
        if (state.active?.stopping) { state.active.stopping = false; refreshControls(); }
        showBanner(m.message || `Error: ${m.code}`);
        state.unavailableBanner = m.code === 'unavailable'; // a later successful open takes it down
      },
      conversation(m) { // tab sync: another tab (or this one) changed a conversation of this user
        if (m.kind === 'renamed') { sidebar.setTitle(m.conversation_id, m.title); return; }
        if (m.kind === 'deleted') { sidebar.remove(m.conversation_id); return; }
        if (m.kind !== 'messages') return;
        sidebar.upsert(m.conversation_id, m.title, { toTop: true, current: m.conversation_id === state.conversationId });
        if (m.conversation_id === state.conversationId) {
          if (busy()) branches.markStale(); // re-read when this tab's own request is done
          else branches.reload().then(adoptActiveFromList).catch(() => {});
        }
      },
      session_ended() { view.setConn('closed'); },
      document(m) { Chat.documents?.frame(m); }, // a file's processing state (documents.js)
    };
  }

  Chat.frames = { handlers };
})();
