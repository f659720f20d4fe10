// Starts Swagger UI on /docs. A file, not an inline script, since the page's
// Content-Security-Policy runs scripts from this origin only; the page's data attributes
// say where the schema and the OAuth2 redirect page are (with any proxy prefix).
"use strict";
(() => {
  const root = document.getElementById("swagger-ui");
  SwaggerUIBundle({
    url: root.dataset.openapiUrl,
    dom_id: "#swagger-ui",
    layout: "BaseLayout",
    deepLinking: true,
    showExtensions: true,
    showCommonExtensions: true,
    oauth2RedirectUrl: new URL(root.dataset.oauth2RedirectUrl, window.location.href).href,
    presets: [SwaggerUIBundle.presets.apis],
    validatorUrl: null, // no validity badge fetched from another origin
  });
})();
