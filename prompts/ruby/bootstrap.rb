# replbox's bootstrap for irb (see docs/bootstrap-protocol.md). Before writing it into the
# session's control directory, replbox replaces the placeholders below, marked `:ruby`, by
# Ruby string literals (in which nothing interpolates).
nc, dir, cell_file = {nonce:ruby}, {ctl:ruby}, {cell_file:ruby}
boot = File.expand_path(__FILE__)
marker, cont = {prompt:ruby}, {continuation:ruby}
IRB.conf[:PROMPT][:RBX] = { PROMPT_I: marker, PROMPT_N: cont, PROMPT_S: cont, PROMPT_C: cont, RETURN: "=> %s\n" }
IRB.conf[:PROMPT_MODE] = :RBX
IRB.conf[:ECHO] = false
IRB.conf[:SAVE_HISTORY] = nil
IRB.conf[:USE_COLORIZE] = false
IRB.conf[:AUTO_INDENT] = false

json_str = lambda do |s|
  s = s.to_s.dup.force_encoding(Encoding::UTF_8).scrub("?")
  '"' + s.gsub(/[\\"\u0000-\u001f\u007f]/) { |c| format("\\u%04x", c.ord) } + '"'
end
emit = lambda do |n, status, err|
  payload = ""
  if err
    payload = ["{\"type\":#{json_str.(err[0])},\"message\":#{json_str.(err[1])}}"].pack("m0")
  end
  [$stdout, $stderr, STDOUT, STDERR].each { |s| s.flush rescue nil }
  STDOUT.syswrite("\e_rbx;#{nc};e;#{n};#{status};#{payload}\e\\")
end
# Print an exception as ruby does, without the frames of this bootstrap and irb.
report = lambda do |e|
  bt = e.backtrace || []
  cut = bt.index { |l| l.start_with?(boot) }
  bt = bt[0...cut] if cut
  if bt.empty?
    first, *rest = e.message.to_s.lines
    $stderr.print("#{first.to_s.chomp} (#{e.class})\n", *rest)
  else
    e.set_backtrace(bt) rescue nil
    $stderr.print(e.full_message(highlight: false, order: :top))
  end
end
# Show a value the way irb shows the value of a typed line.
show = lambda do |ctx, src, value|
  next if value.nil?
  irb = ctx.irb
  ctx.set_last_value(value)
  if irb.respond_to?(:assignment_expression?) && irb.assignment_expression?(src)
    mode = ctx.echo_on_assignment
    irb.output_value(mode == :truncate) if mode
  elsif irb.respond_to?(:output_value)
    irb.output_value
  else
    puts "=> #{value.inspect}"
  end
end
Object.send(:define_method, :__rbx_eval) do |n|
  STDOUT.syswrite("\e_rbx;#{nc};s;#{n}\e\\")
  ctx = IRB.CurrentContext
  status, err, value, exiting = "ok", nil, nil, false
  begin
    src = File.read(File.join(dir, cell_file.sub("{n}", n.to_s)), encoding: "UTF-8")
    done = false
    # irb's `exit` throws :IRB_EXIT, and irb then exits 0 whatever the argument.
    code = catch(:IRB_EXIT) do
      value = eval(src, ctx.workspace.binding, "<cell #{n}>", 1)
      done = true
    end
    unless done
      exiting = true
      Kernel.exit([true, false].include?(code) || code.is_a?(Integer) ? code : 0)
    end
    show.(ctx, src, value)
  rescue SystemExit
    exiting = true
    raise
  rescue IRB::Abort, Interrupt
    status, err = "interrupted", ["Interrupt", ""]
    $stderr.puts "Interrupt"
  rescue Exception => e
    status, err = "error", [e.class.name || e.class.inspect, e.message.to_s[0, 2000]]
    report.(e)
  ensure
    emit.(n, status, err) unless exiting
  end
  value
end
Object.send(:private, :__rbx_eval)
