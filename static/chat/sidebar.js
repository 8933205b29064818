/* chatsite chat page: the conversation sidebar. Row menus (one open at a time; closed by an outside
 * click or Escape), rename/delete in place (deleting another chat keeps you where you are; renaming does
 * not reorder), new and updated rows, and the phone-width drawer. Exposes window.Chat.sidebar. */
(() => {
  'use strict';
  const Chat = (window.Chat = window.Chat || {});
  const { $, $$ } = Chat;
  const ID_PLACEHOLDER = '987654321'; // the id the template reverses URLs with
  const withId = (s, id) => s.split(ID_PLACEHOLDER).join(String(id));

  function init({ app, list, toggle, firstPage, currentId, onCurrentDeleted, onCurrentRenamed }) {
    const csrf = () => $('input[name="csrfmiddlewaretoken"]', app)?.value || '';
    const row = (id) => (list ? $(`.conversation-item[data-conversation-id="${Number(id)}"]`, list) : null);

    const setMenu = (button, open) => {
      button.setAttribute('aria-expanded', String(open));
      document.getElementById(button.getAttribute('aria-controls')).hidden = !open;
    };
    const closeMenus = (except = null) => {
      for (const b of $$('.row-menu-button[aria-expanded="true"]', list || document)) if (b !== except) setMenu(b, false);
    };
    list?.addEventListener('click', (e) => {
      const button = e.target.closest('.row-menu-button');
      if (!button) return;
      const open = button.getAttribute('aria-expanded') !== 'true';
      closeMenus(button);
      setMenu(button, open);
      if (open) $('input[name="title"]', document.getElementById(button.getAttribute('aria-controls')))?.focus();
    });
    document.addEventListener('click', (e) => {
      if (!e.target.closest('.row-menu-button, .conversation-actions-panel')) closeMenus();
    });
    document.addEventListener('keydown', (e) => {
      if (e.key !== 'Escape') return;
      const open = $('.row-menu-button[aria-expanded="true"]', list || document);
      if (open) { setMenu(open, false); open.focus(); e.stopPropagation(); return; }
      setDrawer(false);
    });

    function setTitle(id, title) {
      const item = row(id);
      if (item && title) {
        $('.conversation-title', item).textContent = title;
        $('.rename-form input[name="title"]', item).value = title;
      }
      if (Number(id) === currentId()) onCurrentRenamed(title);
    }

    function remove(id) {
      row(id)?.remove();
      if (list && !$('.conversation-item', list)) {
        list.insertAdjacentHTML('beforeend', '<li class="sidebar-empty">No conversations yet.</li>');
      }
      if (Number(id) === currentId()) onCurrentDeleted();
    }

    /** Show `id` as the current conversation, adding its row (first page only) and moving it to the top
     * when it has new activity. */
    function upsert(id, title, { toTop = true, current = false } = {}) {
      if (!list) return;
      let item = row(id);
      if (!item && firstPage) {
        const frag = $('#conversation-item-template').content.cloneNode(true);
        for (const node of frag.querySelectorAll('[href],[action],[id],[for],[aria-controls],[data-conversation-id]')) {
          for (const attr of ['href', 'action', 'id', 'for', 'aria-controls', 'data-conversation-id']) {
            if (node.hasAttribute(attr)) node.setAttribute(attr, withId(node.getAttribute(attr), id));
          }
        }
        item = frag.querySelector('.conversation-item');
        $('.sidebar-empty', list)?.remove();
        list.prepend(item);
      }
      if (!item) return;
      if (title) setTitle(id, title);
      if (toTop && firstPage && list.firstElementChild !== item) list.prepend(item);
      if (current) {
        $$('.conversation-link[aria-current]', list).forEach((a) => a.removeAttribute('aria-current'));
        $('.conversation-link', item).setAttribute('aria-current', 'page');
      }
    }

    async function post(form) {
      const resp = await fetch(form.action, {
        method: 'POST',
        body: new FormData(form),
        headers: { Accept: 'application/json', 'X-CSRFToken': csrf() },
        credentials: 'same-origin',
      });
      const data = await resp.json().catch(() => ({}));
      if (!resp.ok) throw new Error(data.error || `The server answered ${resp.status}.`);
      return data;
    }

    list?.addEventListener('submit', async (e) => {
      const form = e.target;
      const item = form.closest('.conversation-item');
      if (!item) return;
      e.preventDefault();
      if (form.classList.contains('delete-form') && !window.confirm(form.dataset.confirm)) return;
      const id = Number(item.dataset.conversationId);
      try {
        const data = await post(form);
        if (form.classList.contains('delete-form')) remove(id);
        else { setTitle(id, data.title); closeMenus(); }
      } catch (err) {
        Chat.showBanner?.(err.message);
      }
    });

    // Phone width: the sidebar is a drawer behind a toggle.
    const setDrawer = (open) => {
      app.classList.toggle('sidebar-open', open);
      toggle.setAttribute('aria-expanded', String(open));
    };
    toggle.addEventListener('click', () => setDrawer(!app.classList.contains('sidebar-open')));
    $('[data-close-sidebar]', app)?.addEventListener('click', () => setDrawer(false));

    return { upsert, setTitle, remove, withId };
  }

  Chat.sidebar = { init, withId };
})();
