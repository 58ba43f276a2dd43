"""The browser pages: the chat playground (/ and /playground) and the live dashboard
(/dashboard, fed by /dashboard/state). Off with --disable-web-ui."""
