"$dp=1 tp=2 pp=1 zero=0 Float, 2 ranks*W
"param/token_embedding.weight@tp0/2Float @"&
param/token_embedding.weight@@ 0*[
$exp_avg/token_embedding.weight@tp0/2Float @"(
exp_avg/token_embedding.weight@@ 0*a
'exp_avg_sq/token_embedding.weight@tp0/2Float @"+
!exp_avg_sq/token_embedding.weight@@ 0*,
param/position_embedding.weightFloat @*.
!exp_avg/position_embedding.weightFloat @*1
$exp_avg_sq/position_embedding.weightFloat @*%
param/blocks.0.ln1.weightFloat@*'
exp_avg/blocks.0.ln1.weightFloat@**
exp_avg_sq/blocks.0.ln1.weightFloat@*#
param/blocks.0.ln1.biasFloat@*%
exp_avg/blocks.0.ln1.biasFloat@*(
exp_avg_sq/blocks.0.ln1.biasFloat@*R
param/blocks.0.qkv.weight@tp0/2Float`@"$
param/blocks.0.qkv.weightÀ@ 0*V
!exp_avg/blocks.0.qkv.weight@tp0/2Float`@"&
exp_avg/blocks.0.qkv.weightÀ@ 0*\
$exp_avg_sq/blocks.0.qkv.weight@tp0/2Float`@")
exp_avg_sq/blocks.0.qkv.weightÀ@ 0*L
param/blocks.0.qkv.bias@tp0/2Float`"!
param/blocks.0.qkv.biasÀ 0*P
exp_avg/blocks.0.qkv.bias@tp0/2Float`"#
exp_avg/blocks.0.qkv.biasÀ 0*V
"exp_avg_sq/blocks.0.qkv.bias@tp0/2Float`"&
exp_avg_sq/blocks.0.qkv.biasÀ 0*_
%param/blocks.0.attn_proj.weight@tp0/2Float@ "+
param/blocks.0.attn_proj.weight@@ 0*c
'exp_avg/blocks.0.attn_proj.weight@tp0/2Float@ "-
!exp_avg/blocks.0.attn_proj.weight@@ 0*i
*exp_avg_sq/blocks.0.attn_proj.weight@tp0/2Float@ "0
$exp_avg_sq/blocks.0.attn_proj.weight@@ 0*)
param/blocks.0.attn_proj.biasFloat@*+
exp_avg/blocks.0.attn_proj.biasFloat@*.
"exp_avg_sq/blocks.0.attn_proj.biasFloat@*%
param/blocks.0.ln2.weightFloat@*'
exp_avg/blocks.0.ln2.weightFloat@**
exp_avg_sq/blocks.0.ln2.weightFloat@*#
param/blocks.0.ln2.biasFloat@*%
exp_avg/blocks.0.ln2.biasFloat@*(
exp_avg_sq/blocks.0.ln2.biasFloat@*Q
param/blocks.0.fc.weight@tp0/2Float€@"#
param/blocks.0.fc.weight€@ 0*U
 exp_avg/blocks.0.fc.weight@tp0/2Float€@"%
exp_avg/blocks.0.fc.weight€@ 0*[
#exp_avg_sq/blocks.0.fc.weight@tp0/2Float€@"(
exp_avg_sq/blocks.0.fc.weight€@ 0*K
param/blocks.0.fc.bias@tp0/2Float€" 
param/blocks.0.fc.bias€ 0*O
exp_avg/blocks.0.fc.bias@tp0/2Float€""
exp_avg/blocks.0.fc.bias€ 0*U
!exp_avg_sq/blocks.0.fc.bias@tp0/2Float€"%
exp_avg_sq/blocks.0.fc.bias€ 0*_
$param/blocks.0.mlp_proj.weight@tp0/2Float@€"+
param/blocks.0.mlp_proj.weight@€ 0*c
&exp_avg/blocks.0.mlp_proj.weight@tp0/2Float@€"-
 exp_avg/blocks.0.mlp_proj.weight@€ 0*i
)exp_avg_sq/blocks.0.mlp_proj.weight@tp0/2Float@€"0
#exp_avg_sq/blocks.0.mlp_proj.weight@€ 0*(
param/blocks.0.mlp_proj.biasFloat@**
exp_avg/blocks.0.mlp_proj.biasFloat@*-
!exp_avg_sq/blocks.0.mlp_proj.biasFloat@*%
param/blocks.1.ln1.weightFloat@*'
exp_avg/blocks.1.ln1.weightFloat@**
exp_avg_sq/blocks.1.ln1.weightFloat@*#
param/blocks.1.ln1.biasFloat@*%
exp_avg/blocks.1.ln1.biasFloat@*(
exp_avg_sq/blocks.1.ln1.biasFloat@*R
param/blocks.1.qkv.weight@tp0/2Float`@"$
param/blocks.1.qkv.weightÀ@ 0*V
!exp_avg/blocks.1.qkv.weight@tp0/2Float`@"&
exp_avg/blocks.1.qkv.weightÀ@ 0*\
$exp_avg_sq/blocks.1.qkv.weight@tp0/2Float`@")
exp_avg_sq/blocks.1.qkv.weightÀ@ 0*L
param/blocks.1.qkv.bias@tp0/2Float`"!
param/blocks.1.qkv.biasÀ 0*P
exp_avg/blocks.1.qkv.bias@tp0/2Float`"#
exp_avg/blocks.1.qkv.biasÀ 0*V
"exp_avg_sq/blocks.1.qkv.bias@tp0/2Float`"&
exp_avg_sq/blocks.1.qkv.biasÀ 0*_
%param/blocks.1.attn_proj.weight@tp0/2Float@ "+
param/blocks.1.attn_proj.weight@@ 0*c
'exp_avg/blocks.1.attn_proj.weight@tp0/2Float@ "-
!exp_avg/blocks.1.attn_proj.weight@@ 0*i
*exp_avg_sq/blocks.1.attn_proj.weight@tp0/2Float@ "0
$exp_avg_sq/blocks.1.attn_proj.weight@@ 0*)
param/blocks.1.attn_proj.biasFloat@*+
exp_avg/blocks.1.attn_proj.biasFloat@*.
"exp_avg_sq/blocks.1.attn_proj.biasFloat@*%
param/blocks.1.ln2.weightFloat@*'
exp_avg/blocks.1.ln2.weightFloat@**
exp_avg_sq/blocks.1.ln2.weightFloat@*#
param/blocks.1.ln2.biasFloat@*%
exp_avg/blocks.1.ln2.biasFloat@*(
exp_avg_sq/blocks.1.ln2.biasFloat@*Q
param/blocks.1.fc.weight@tp0/2Float€@"#
param/blocks.1.fc.weight€@ 0*U
 exp_avg/blocks.1.fc.weight@tp0/2Float€@"%
exp_avg/blocks.1.fc.weight€@ 0*[
#exp_avg_sq/blocks.1.fc.weight@tp0/2Float€@"(
exp_avg_sq/blocks.1.fc.weight€@ 0*K
param/blocks.1.fc.bias@tp0/2Float€" 
param/blocks.1.fc.bias€ 0*O
exp_avg/blocks.1.fc.bias@tp0/2Float€""
exp_avg/blocks.1.fc.bias€ 0*U
!exp_avg_sq/blocks.1.fc.bias@tp0/2Float€"%
exp_avg_sq/blocks.1.fc.bias€ 0*_
$param/blocks.1.mlp_proj.weight@tp0/2Float@€"+
param/blocks.1.mlp_proj.weight@€ 0*c
&exp_avg/blocks.1.mlp_proj.weight@tp0/2Float@€"-
 exp_avg/blocks.1.mlp_proj.weight@€ 0*i
)exp_avg_sq/blocks.1.mlp_proj.weight@tp0/2Float@€"0
#exp_avg_sq/blocks.1.mlp_proj.weight@€ 0*(
param/blocks.1.mlp_proj.biasFloat@**
exp_avg/blocks.1.mlp_proj.biasFloat@*-
!exp_avg_sq/blocks.1.mlp_proj.biasFloat@*
param/ln_f.weightFloat@*
exp_avg/ln_f.weightFloat@*"
exp_avg_sq/ln_f.weightFloat@*
param/ln_f.biasFloat@*
exp_avg/ln_f.biasFloat@* 
exp_avg_sq/ln_f.biasFloat@*A
param/head.weight@tp0/2Float @"
param/head.weight@@ 0*E
exp_avg/head.weight@tp0/2Float @"
exp_avg/head.weight@@ 0*K
exp_avg_sq/head.weight@tp0/2Float @" 
exp_avg_sq/head.weight@@ 0*
rank/0/rng/defaultByteÀ'*&
rank/0/rng/tensor-parallelByteÀ'*Y
"param/token_embedding.weight@tp1/2Float @"(
param/token_embedding.weight@@ (0*]
$exp_avg/token_embedding.weight@tp1/2Float @"*
exp_avg/token_embedding.weight@@ (0*c
'exp_avg_sq/token_embedding.weight@tp1/2Float @"-
!exp_avg_sq/token_embedding.weight@@ (0*T
param/blocks.0.qkv.weight@tp1/2Float`@"&
param/blocks.0.qkv.weightÀ@ (0*X
!exp_avg/blocks.0.qkv.weight@tp1/2Float`@"(
exp_avg/blocks.0.qkv.weightÀ@ (0*^
$exp_avg_sq/blocks.0.qkv.weight@tp1/2Float`@"+
exp_avg_sq/blocks.0.qkv.weightÀ@ (0*N
param/blocks.0.qkv.bias@tp1/2Float`"#
param/blocks.0.qkv.biasÀ (0*R
exp_avg/blocks.0.qkv.bias@tp1/2Float`"%
exp_avg/blocks.0.qkv.biasÀ (0*X
"exp_avg_sq/blocks.0.qkv.bias@tp1/2Float`"(
exp_avg_sq/blocks.0.qkv.biasÀ (0*a
%param/blocks.0.attn_proj.weight@tp1/2Float@ "-
param/blocks.0.attn_proj.weight@@ (0*e
'exp_avg/blocks.0.attn_proj.weight@tp1/2Float@ "/
!exp_avg/blocks.0.attn_proj.weight@@ (0*k
*exp_avg_sq/blocks.0.attn_proj.weight@tp1/2Float@ "2
$exp_avg_sq/blocks.0.attn_proj.weight@@ (0*S
param/blocks.0.fc.weight@tp1/2Float€@"%
param/blocks.0.fc.weight€@ (0*W
 exp_avg/blocks.0.fc.weight@tp1/2Float€@"'
exp_avg/blocks.0.fc.weight€@ (0*]
#exp_avg_sq/blocks.0.fc.weight@tp1/2Float€@"*
exp_avg_sq/blocks.0.fc.weight€@ (0*M
param/blocks.0.fc.bias@tp1/2Float€""
param/blocks.0.fc.bias€ (0*Q
exp_avg/blocks.0.fc.bias@tp1/2Float€"$
exp_avg/blocks.0.fc.bias€ (0*W
!exp_avg_sq/blocks.0.fc.bias@tp1/2Float€"'
exp_avg_sq/blocks.0.fc.bias€ (0*a
$param/blocks.0.mlp_proj.weight@tp1/2Float@€"-
param/blocks.0.mlp_proj.weight@€ (0*e
&exp_avg/blocks.0.mlp_proj.weight@tp1/2Float@€"/
 exp_avg/blocks.0.mlp_proj.weight@€ (0*k
)exp_avg_sq/blocks.0.mlp_proj.weight@tp1/2Float@€"2
#exp_avg_sq/blocks.0.mlp_proj.weight@€ (0*T
param/blocks.1.qkv.weight@tp1/2Float`@"&
param/blocks.1.qkv.weightÀ@ (0*X
!exp_avg/blocks.1.qkv.weight@tp1/2Float`@"(
exp_avg/blocks.1.qkv.weightÀ@ (0*^
$exp_avg_sq/blocks.1.qkv.weight@tp1/2Float`@"+
exp_avg_sq/blocks.1.qkv.weightÀ@ (0*N
param/blocks.1.qkv.bias@tp1/2Float`"#
param/blocks.1.qkv.biasÀ (0*R
exp_avg/blocks.1.qkv.bias@tp1/2Float`"%
exp_avg/blocks.1.qkv.biasÀ (0*X
"exp_avg_sq/blocks.1.qkv.bias@tp1/2Float`"(
exp_avg_sq/blocks.1.qkv.biasÀ (0*a
%param/blocks.1.attn_proj.weight@tp1/2Float@ "-
param/blocks.1.attn_proj.weight@@ (0*e
'exp_avg/blocks.1.attn_proj.weight@tp1/2Float@ "/
!exp_avg/blocks.1.attn_proj.weight@@ (0*k
*exp_avg_sq/blocks.1.attn_proj.weight@tp1/2Float@ "2
$exp_avg_sq/blocks.1.attn_proj.weight@@ (0*S
param/blocks.1.fc.weight@tp1/2Float€@"%
param/blocks.1.fc.weight€@ (0*W
 exp_avg/blocks.1.fc.weight@tp1/2Float€@"'
exp_avg/blocks.1.fc.weight€@ (0*]
#exp_avg_sq/blocks.1.fc.weight@tp1/2Float€@"*
exp_avg_sq/blocks.1.fc.weight€@ (0*M
param/blocks.1.fc.bias@tp1/2Float€""
param/blocks.1.fc.bias€ (0*Q
exp_avg/blocks.1.fc.bias@tp1/2Float€"$
exp_avg/blocks.1.fc.bias€ (0*W
!exp_avg_sq/blocks.1.fc.bias@tp1/2Float€"'
exp_avg_sq/blocks.1.fc.bias€ (0*a
$param/blocks.1.mlp_proj.weight@tp1/2Float@€"-
param/blocks.1.mlp_proj.weight@€ (0*e
&exp_avg/blocks.1.mlp_proj.weight@tp1/2Float@€"/
 exp_avg/blocks.1.mlp_proj.weight@€ (0*k
)exp_avg_sq/blocks.1.mlp_proj.weight@tp1/2Float@€"2
#exp_avg_sq/blocks.1.mlp_proj.weight@€ (0*C
param/head.weight@tp1/2Float @"
param/head.weight@@ (0*G
exp_avg/head.weight@tp1/2Float @"
exp_avg/head.weight@@ (0*M
exp_avg_sq/head.weight@tp1/2Float @""
exp_avg_sq/head.weight@@ (0*
rank/1/rng/defaultByteÀ'*&
rank/1/rng/tensor-parallelByteÀ'2
rank-00000.bin€*2
rank-00001.bin€ù':
€2¶±µ‚:€(€@2‹ó”²:€(€€2ù‚ªø:€(€À2¨‡Ô®
:€(€€2ğ¥†À:€(€À2ÚşÒ‰:@(€€2»×ş˜:@(€‚2Ó¢õÔ:@(€„2¤šÖ:	@(€†2£Õ›Û	:
@(€ˆ2øÊóÛ:@(€Š2ñ Ö:€0(€Œ2¿Ëäİ:€0(€Ì2öâè©:€0(€Œ2ŸÿÿÄ:`(€Ì2˜äØ:`(€Ï2œ¼Ì:`(€Ò2¿ûõ‡:€(€Õ2ñõØ°:€(€•2Æ‘ï¡:€(€Õ2¬¸ùé:@(€•	2Êç£é:@(€—	2­¥¼¢:@(€™	2ã°ö:@(€›	2ù¸‘î:@(€	2• ºÇ:@(€Ÿ	2ûáğ:@(€¡	2…Å³Ñ	:@(€£	2€„“‹:@(€¥	2–éïŠ	:€@(€§	2ÔĞÍ,:€@(€§2ãòğ: €@(€§2ÂÍí½:!€(€§2ÿÏÎö
:"€(€«2ªŒÍµ:#€(€¯2‚ ğ:$€@(€³2¢ûö˜:%€@(€³2Ì :&€@(€³2êç
:'@(€³2 ”±ÿ:(@(€µ2ûÜèï:)@(€·2¯şèÉ:*@(€¹2’ñÖÆ
:+@(€»2›æ„½:,@(€½2Ã½Ğ¤:-@(€¿2”œ÷‹:.@(€Á2õüí:/@(€Ã2€ˆ:0€0(€Å2€ç2:1€0(€…2Ö•ü‘:2€0(€Å2²¶Ê£:3`(€…2Ñ‘Ø­:4`(€ˆ2ƒ :5`(€‹2„®ò²
:6€(€2ôé›ú:7€(€Î2ü´ÿÜ:8€(€2ò²£…:9@(€Î2Õîû€::@(€Ğ2¶¡µ©:;@(€Ò2±’ïÌ:<@(€Ô2î³•²:=@(€Ö2şÄ¹œ:>@(€Ø2êÓ³À:?@(€Ú2Ó¤ÔÕ:@@(€Ü2­¿—×	:A@(€Ş2ï‹õò:B€@(€à2÷ôö¿:C€@(€à2ÑÓ´Œ:D€@(€à2àã¸À:E€(€à!2×ÏÊ:F€(€ä!2®·Òõ:G€(€è!2ó¦ÅË:H€@(€ì!2’íúğ:I€@(€ì#2·š–À:J€@(€ì%2Ìø:K@(€ì'2´°Â¤:L@(€î'2¢ÄÂ:M@(€ğ'2Íéæ½:N@(€ò'2Ø¸Ö:O@(€ô'2÷İÂ‡:P@(€ö'2¢«Ö¾:Q@(€ø'2â¥Èõ:R@(€ú'2Ê’ñ¶:S@(€ü'2ò®ê¤:T€(€ş'2£ùÀÚ
:U€(€¾(2Ÿìë:V€(€ş(2×‰‰:WÀ'(€¾)2Ì­ö¸:XÀ'(Àå)2ÏØ˜è:Y€ 2†ñÅâ:Z€ (€@2Ø—ùĞ:[€ (€€2úƒ«¦:\€0 (€À2ûÜà€	:]€0 (€€2ÈêúÄ:^€0 (€À2³à¿Ú
:_` (€€2”úÛ‹:`` (€ƒ2¤÷Ûÿ:a` (€†2«öÄ§:b€ (€‰2‚¯à£:c€ (€É2‡ôÛë:d€ (€‰2èÙì”:e€@ (€É2õä™	:f€@ (€É	2ú§›î:g€@ (€É2¬ËŠş:h€ (€É2³Üêç:i€ (€Í2ñœ¹:j€ (€Ñ2ˆ³‚:k€@ (€Õ2ÓÍ«Ü:l€@ (€Õ2ĞÒ—¥:m€@ (€Õ2ÍÔ³„	:n€0 (€Õ2ëÔÀ×	:o€0 (€•2ö¢âü:p€0 (€Õ2À­ĞÄ
:q` (€•2‘”¶Ö:r` (€˜2±ÄÇ
:s` (€›2‰˜¯ó:t€ (€2Âù†á
:u€ (€Ş2Å«êî:v€ (€2Ëşı”:w€@ (€Ş2ûÚ¯Û:x€@ (€Ş2ñŠÌº:y€@ (€Ş2ùÙÿ:z€ (€Ş2Û–ÂÍ	:{€ (€â2Òñó`:|€ (€æ2€¥¶Ô:}€@ (€ê2›Ãíº	:~€@ (€ê!2‰Î:€@ (€ê#2èˆ—³:€€ (€ê%2ëÖ¹¤:€ (€ª&2á™öÏ:‚€ (€ê&2›¿ü•:ƒÀ' (€ª'2Ì­ö¸:„À' (ÀÑ'2¿šØBP€€@