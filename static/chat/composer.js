/* chatsite chat page: the composer. Autosize, a character counter that warns instead of cutting pasted
 * text, Enter to send, edit mode (sending creates a sibling branch), and the retry policy for busy /
 * rate-limited answers. Exposes window.Chat.composer and Chat.retryDelay. */
(() => {
  'use strict';
  const Chat = (window.Chat = window.Chat || {});
  const { $ } = Chat;

  /** Seconds to wait before retry number `attempt` (0-based) under the tier's policy
   * ({kind: "linear"|"exponential", base_s, cap_s}, billing.selectors.tier_backoff), never below the
   * server's retry_after. */
  Chat.retryDelay = (policy, attempt, retryAfter) => {
    const base = Number(policy?.base_s) || 5;
    const cap = Number(policy?.cap_s) || base;
    const own = policy?.kind === 'exponential' ? Math.min(cap, base * 2 ** attempt) : base;
    return Math.max(own, Number(retryAfter) || 0);
  };

  function init({ form, textarea, counter, maxChars, onSubmit, editNote, editCancel }) {
    let editing = null; // {id, previous}: the user message being edited, and the draft it replaced

    function over() { return maxChars ? textarea.value.length - maxChars : -1; }

    function autosize() {
      textarea.style.height = 'auto';
      textarea.style.height = `${Math.min(textarea.scrollHeight, 240)}px`;
      const n = textarea.value.length;
      const excess = over();
      counter.hidden = !maxChars || n < maxChars * 0.8;
      counter.classList.toggle('over', excess > 0);
      counter.textContent = excess > 0
        ? `${n} / ${maxChars} characters — ${excess} over the limit`
        : `${n} / ${maxChars}`;
    }

    function submit() {
      const text = textarea.value;
      if (!text.trim()) return;
      if (over() > 0) {
        Chat.showBanner(`The message is ${text.length} characters; the limit is ${maxChars}. `
          + `Shorten it by ${over()} characters (nothing was cut).`);
        return;
      }
      const edit = editing;
      if (onSubmit(text, edit ? edit.id : null) === false) return;
      textarea.value = '';
      if (edit) stopEdit(false);
      autosize();
    }

    function startEdit(id, text) {
      editing = { id, previous: editing ? editing.previous : textarea.value };
      textarea.value = text;
      editNote.hidden = false;
      autosize();
      textarea.focus();
    }

    function stopEdit(restore = true) {
      if (!editing) return;
      if (restore) textarea.value = editing.previous;
      editing = null;
      editNote.hidden = true;
      autosize();
    }

    /** Put `text` back (a message that was not stored), unless the person typed something new. */
    function restore(text) {
      if (text && !textarea.value) { textarea.value = text; autosize(); }
    }

    /** Take `text` out of the composer when it is being sent by other means (banner Retry). */
    function consume(text) {
      if (textarea.value === text) { textarea.value = ''; autosize(); }
    }

    form.addEventListener('submit', (e) => { e.preventDefault(); submit(); });
    textarea.addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); submit(); }
      if (e.key === 'Escape' && editing) { e.preventDefault(); stopEdit(); }
    });
    textarea.addEventListener('input', autosize);
    textarea.addEventListener('paste', () => setTimeout(() => {
      if (over() > 0) {
        Chat.showBanner(`The pasted text makes the message ${textarea.value.length} characters; the limit is `
          + `${maxChars}. Nothing was cut: shorten it by ${over()} characters to send it.`);
      }
    }, 0));
    editCancel.addEventListener('click', () => { stopEdit(); textarea.focus(); });
    autosize();
    return { startEdit, stopEdit, restore, consume, autosize, focus: () => textarea.focus() };
  }

  Chat.composer = { init };
})();
