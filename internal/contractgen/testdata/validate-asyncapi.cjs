// Parses and validates an AsyncAPI document with the AsyncAPI project's
// own parser: every $ref resolved, the AsyncAPI 3.0 schema and the
// parser's rules applied. Prints every diagnostic; exits 1 on an error.
const { Parser, fromFile } = require('@asyncapi/parser');

async function main() {
  const parser = new Parser();
  const { document, diagnostics } = await fromFile(parser, process.argv[2]).parse();
  let errors = 0;
  for (const d of diagnostics) {
    // severity 0 is an error, 1 a warning, 2 information, 3 a hint
    console.log(`${['error', 'warning', 'info', 'hint'][d.severity]} ${d.code} at ${d.path.join('.')}: ${d.message}`);
    if (d.severity === 0) errors++;
  }
  if (!document || errors > 0) {
    console.log(`${errors} error(s)`);
    process.exit(1);
  }
  console.log(`valid AsyncAPI ${document.version()}: ${document.channels().length} channels, ${document.operations().length} operations, ${document.components().messages().length} messages`);
}

main().catch((e) => { console.error(e); process.exit(1); });
