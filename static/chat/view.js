/* chatsite chat page: the page's status surfaces and its message list. The banner, the queue and connection
 * status lines, message lookup and scrolling, new bubbles, and the controls of the last message (Regenerate or
 * Retry, Continue, the branch switchers' lock). Exposes window.Chat.view; chat.js owns the state it reads. */
(() => {
  'use strict';
  const Chat = (window.Chat = window.Chat || {});
  const { $, $$, FINAL, render } = Chat;

  /** The view over the page's elements `els` (chat.js: list, stop, send, conn, queue, queueText, queueCancel,
   * banner), reading the controller's `state` (`active`, `conversationId`) and `busy()` live. Returns
   * its functions; `showBanner` is also Chat.showBanner, for the other modules. */
  function init({ els, state, busy }) {
    function showBanner(text, retry = null) {
      $('.banner-text', els.banner).textContent = text;
      const btn = $('.banner-retry', els.banner);
      btn.hidden = !retry;
      btn.onclick = retry && (() => { hideBanner(); retry(); });
      els.banner.hidden = false;
    }
    const hideBanner = () => { els.banner.hidden = true; };

    function setQueueStatus(text, kind = '', cancellable = false) {
      els.queueText.textContent = text;
      els.queue.hidden = !text;
      els.queue.dataset.state = text ? kind : '';
      els.queueCancel.hidden = !cancellable;
    }
    const CONN_TEXT = {
      connecting: 'Connecting…', reconnecting: 'Reconnecting…', unavailable: 'Briefly unavailable — reconnecting…',
      open: 'Connected', closed: 'Signed out — reload the page',
    };
    function setConn(st) { els.conn.dataset.state = st; els.conn.textContent = CONN_TEXT[st]; }

    const messageById = (id) => (id == null ? null : $(`.message[data-message-id="${Number(id)}"]`, els.list));
    const lastMessage = () => $$('.message', els.list).pop() || null;
    const nearBottom = () => els.list.scrollHeight - els.list.scrollTop - els.list.clientHeight < 80;
    const scrollToBottom = () => { els.list.scrollTop = els.list.scrollHeight; };

    function addMessage(role, id, status) {
      $('#empty-state')?.remove();
      const el = render.bubble(role, id, status);
      els.list.append(el);
      scrollToBottom();
      return el;
    }

    /** Regenerate/Retry and Continue only on the last message, only while nothing runs. */
    function refreshControls() {
      render.joinContinuations(els.list);
      const isBusy = busy();
      els.send.disabled = isBusy;
      els.stop.hidden = !isBusy;
      els.stop.disabled = Boolean(state.active?.stopping);
      // The buttons are rebuilt; keyboard focus on one of them stays on its replacement.
      const focusedCls = ['regenerate-button', 'continue-button'].find((c) => document.activeElement?.classList.contains(c));
      $$('.regenerate-button, .continue-button', els.list).forEach((b) => b.remove());
      $$('.branch-nav button', els.list).forEach((b) => { b.classList.toggle('locked', isBusy); });
      const last = lastMessage();
      if (isBusy && focusedCls) $('#composer').focus(); // the pressed button is gone while the reply runs
      if (isBusy || !last || !state.conversationId || !last.dataset.messageId) return;
      const isAssistant = last.classList.contains('assistant');
      if (isAssistant ? !FINAL.has(last.dataset.status) : !last.classList.contains('user')) return;
      const actions = $('.actions', last);
      const button = (cls, label) => actions.append(Object.assign(document.createElement('button'),
        { type: 'button', className: `button small ${cls}`, textContent: label }));
      if (isAssistant && last.dataset.status === 'completed' && last.dataset.finishReason === 'length') {
        button('continue-button', 'Continue');
      }
      button('regenerate-button',
        (!isAssistant || ['failed', 'interrupted'].includes(last.dataset.status)) ? 'Retry' : 'Regenerate');
      if (focusedCls) $(`.${focusedCls}`, actions)?.focus();
    }

    return {
      showBanner, hideBanner, setQueueStatus, setConn, messageById, lastMessage, nearBottom, scrollToBottom,
      addMessage, refreshControls,
    };
  }

  Chat.view = { init };
})();
