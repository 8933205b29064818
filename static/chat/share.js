/* chatsite shared snapshot page: render the replies' markdown with the chat page's renderer. */
(() => {
  'use strict';
  const root = document.querySelector('.share-page');
  if (root && window.Chat?.render) window.Chat.render.hydrate(root);
})();
